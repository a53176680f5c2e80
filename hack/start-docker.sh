#!/usr/bin/env bash
# start-docker.sh makes a Docker engine available on this Linux machine for the
# integration tests: it installs docker.io when no engine answers, starts dockerd
# in the background when it is not running (CI has no systemd), and waits until
# the engine answers. Safe to run any number of times.
set -euo pipefail

log() { printf 'start-docker: %s\n' "$*" >&2; }

# In a sandbox whose capability bounding set lacks capabilities (CAP_SYS_RESOURCE
# on some CI machines), `docker run --privileged` -- kind's nodes -- fails with
# "unable to apply caps". hack/runc-capfilter drops the capabilities this
# machine cannot grant before runc runs; make it the engine's default runtime
# (reloaded with SIGHUP, running containers are untouched). A no-op where the
# bounding set is complete or the engine is configured otherwise.
capfilter() {
	[ "$(id -u)" -eq 0 ] || return 0
	local last bnd full
	last=$(cat /proc/sys/kernel/cap_last_cap 2>/dev/null) || return 0
	bnd=$(awk '/^CapBnd:/{print $2}' /proc/self/status)
	full=$(( (1 << (last + 1)) - 1 ))
	[ $(( 16#$bnd & full )) -ne "$full" ] || return 0
	if [ -s /etc/docker/daemon.json ] && ! grep -q capfilter /etc/docker/daemon.json; then
		log "capability bounding set is $bnd and /etc/docker/daemon.json exists: not changing it; privileged containers (kind) may fail"
		return 0
	fi
	command -v go >/dev/null 2>&1 || { log "no go to build hack/runc-capfilter; privileged containers (kind) may fail"; return 0; }
	( cd "$(dirname "$0")/.." && CGO_ENABLED=0 go build -o /usr/local/bin/runc-capfilter ./hack/runc-capfilter )
	mkdir -p /etc/docker
	printf '{"default-runtime": "capfilter", "runtimes": {"capfilter": {"path": "/usr/local/bin/runc-capfilter"}}}\n' >/etc/docker/daemon.json
	if pgrep -x dockerd >/dev/null 2>&1; then
		kill -HUP "$(pgrep -x dockerd)"
		sleep 1
	fi
	log "capability bounding set $bnd is incomplete: runc-capfilter is the default runtime"
}

if docker info >/dev/null 2>&1; then
	capfilter
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
		capfilter
		log "engine answers (after ${i}s)"
		exit 0
	fi
	sleep 1
done
log "dockerd did not answer within 60s; last log lines:"
tail -n 30 /var/log/dockerd.log >&2 || true
exit 1
