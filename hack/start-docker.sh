#!/usr/bin/env bash
# start-docker.sh makes a Docker engine available on this Linux machine for the
# integration tests: it installs docker.io when no engine answers, starts dockerd
# in the background when it is not running (CI has no systemd), and waits until
# the engine answers. Safe to run any number of times.
set -euo pipefail

log() { printf 'start-docker: %s\n' "$*" >&2; }

if docker info >/dev/null 2>&1; then
	log "engine already answers"
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	log "no Docker engine answers and this script needs root to install/start one"
	exit 1
fi

if ! command -v dockerd >/dev/null 2>&1; then
	log "installing docker.io"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq docker.io >/dev/null
fi

# docker.io may have installed its own client over a newer one; either works.
if ! pgrep -x dockerd >/dev/null 2>&1; then
	log "starting dockerd"
	mkdir -p /var/log
	nohup dockerd >/var/log/dockerd.log 2>&1 &
fi

for i in $(seq 1 60); do
	if docker info >/dev/null 2>&1; then
		log "engine answers (after ${i}s)"
		exit 0
	fi
	sleep 1
done
log "dockerd did not answer within 60s; last log lines:"
tail -n 30 /var/log/dockerd.log >&2 || true
exit 1
