#!/usr/bin/env bash
# Builds the programs of bench/pods' peer node into _output/bench/peer-bin, the
# way klimax's node-image builder does (internal/klimax/nodeimage/binaries.go),
# for machines without its cache (`make node-image` leaves them in
# ~/.cache/klimax/node-image/bin-*, which bench/pods also finds):
#   kubelet                  k8s.io/kubernetes/cmd/kubelet at the version go.mod pins
#   containerd, its shim     github.com/containerd/containerd/v2 at nodeimage.ContainerdVersion
#   pause                    internal/klimax/nodeimage/cmd/pause
# runc and the CNI plugins are Debian's (apt-get install -y runc containernetworking-plugins).
# Only the Go module proxy is used; a warm build cache makes the kubelet a relink.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
out=$PWD/_output/bench/peer-bin
mkdir -p "$out"

kv=$($GO list -m -f '{{.Version}}' k8s.io/kubernetes)
cv=$(sed -n 's/^\tContainerdVersion *= "\(v[^"]*\)".*/\1/p' internal/klimax/nodeimage/nodeimage.go)
if [[ -z $kv || -z $cv ]]; then
	echo "peer-bin: cannot read the Kubernetes version (go.mod) or ContainerdVersion (internal/klimax/nodeimage/nodeimage.go)" >&2
	exit 1
fi
major=${kv#v}; major=${major%%.*}
minor=${kv#v}; minor=${minor#*.}; minor=${minor%%.*}
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ld+=" -X $p.gitVersion=$kv -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

echo "peer-bin: kubelet $kv" >&2
$GO build -ldflags "$ld" -o "$out/kubelet" k8s.io/kubernetes/cmd/kubelet
echo "peer-bin: pause" >&2
CGO_ENABLED=0 $GO build -ldflags "-s -w" -o "$out/pause" ./internal/klimax/nodeimage/cmd/pause
for c in containerd containerd-shim-runc-v2; do
	echo "peer-bin: $c $cv" >&2
	tags=""
	if [[ $c == containerd ]]; then tags="no_btrfs,no_devmapper,no_zfs,no_aufs"; fi
	GOBIN="$out" $GO install -tags "$tags" -ldflags "-s -w" "github.com/containerd/containerd/v2/cmd/$c@$cv"
done
"$out/kubelet" --version
"$out/containerd" --version
