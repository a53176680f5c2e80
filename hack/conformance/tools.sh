#!/usr/bin/env bash
# Builds the upstream conformance tools at the pinned Kubernetes version from
# the Go module proxy: e2e.test, ginkgo and kubectl. A throw-away module
# requires k8s.io/kubernetes and replaces its staging modules by their
# published versions (the same replaces as k3sm's go.mod), so nothing of
# k3sm is rebuilt. Cached by version in $CACHE; prints the directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
K8S_VERSION="${K8S_VERSION:-$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$root/go.mod")}"
CACHE="${K3SM_CONFORMANCE_CACHE:-$HOME/.cache/k3sm-conformance}/$K8S_VERSION"
bin="$CACHE/bin"
if [ -x "$bin/e2e.test" ] && [ -x "$bin/ginkgo" ] && [ -x "$bin/kubectl" ]; then
	echo "$bin"
	exit 0
fi
mkdir -p "$CACHE/mod" "$bin"
cd "$CACHE/mod"
{
	echo "module k3sm.invalid/conformance"
	echo
	echo "go $(go env GOVERSION | sed 's/^go//')"
	echo
	echo "require k8s.io/kubernetes $K8S_VERSION"
	echo
	# Staging modules: k8s.io/kubernetes requires them at v0.0.0 and
	# replaces them with ./staging, which only works inside its own tree.
	grep -E '^\s*k8s\.io/[a-z0-9-]+ => k8s\.io/[a-z0-9-]+ v0\.' "$root/go.mod" | sed 's/^\s*/replace /'
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/test/e2e"
)
GO
export GOFLAGS=-mod=mod CGO_ENABLED=0
step() { echo "conformance tools: $*" >&2; }
v="$K8S_VERSION"
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	minor="${v#v1.}"; minor="${minor%%.*}"
	ldflags="$ldflags -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
step "resolving modules for k8s.io/kubernetes $v"
# No "go get PKG": it would upgrade ginkgo and others past the versions
# k8s.io/kubernetes pins; -mod=mod adds what is missing at those versions.
go mod download k8s.io/kubernetes >&2
start=$(date +%s)
step "building kubectl"
go build -ldflags "$ldflags" -o "$bin/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl && mv "$bin/kubectl.tmp" "$bin/kubectl"
step "building ginkgo"
go build -o "$bin/ginkgo.tmp" github.com/onsi/ginkgo/v2/ginkgo && mv "$bin/ginkgo.tmp" "$bin/ginkgo"
step "building e2e.test (about 15 minutes cold on 2 cores)"
go test -c -ldflags "$ldflags" -o "$bin/e2e.test.tmp" k8s.io/kubernetes/test/e2e && mv "$bin/e2e.test.tmp" "$bin/e2e.test"
step "built in $(( $(date +%s) - start ))s"
echo "$bin"
