#!/usr/bin/env bash
# node-image.sh builds, or reuses, the offline kind node image klimax
# clusters run (klimax node-image build) and the tools its integration test
# needs, for CI and developers. Everything expensive is cached outside the
# clone (${XDG_CACHE_HOME:-~/.cache}/klimax/node-image, keyed by versions),
# and an image already in the engine with the same key is kept, so the
# second run on a machine takes seconds.
#
# Without a Docker engine it says so and exits 0 (the integration test then
# skips), so callers need not check first. Needs root only for the first
# debootstrap.
set -euo pipefail

log() { printf 'node-image: %s\n' "$*" >&2; }
cd "$(dirname "$0")/.."

# the kind klimax pins (guest.DefaultKind)
KIND_VERSION=${KIND_VERSION:-$(sed -n 's/.*DefaultKind *= Tool{Version: "\(v[^"]*\)".*/\1/p' internal/klimax/guest/provision.go)}
export PATH="$PATH:$(go env GOPATH)/bin"

if ! docker info >/dev/null 2>&1; then
	log "no Docker engine answers (hack/start-docker.sh starts one); not building the node image"
	exit 0
fi

# kind at the version that creates clusters of this Kubernetes version
if [ "$(kind version 2>/dev/null | awk '{print $2}')" != "$KIND_VERSION" ]; then
	log "installing kind $KIND_VERSION"
	go install "sigs.k8s.io/kind@$KIND_VERSION"
fi

if ! command -v debootstrap >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
	log "installing debootstrap"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

go build -o bin/klimax ./cmd/klimax
start=$(date +%s)
./bin/klimax node-image build --source . "$@"
log "done in $(( $(date +%s) - start ))s"
