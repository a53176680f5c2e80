#!/usr/bin/env bash
# Runs the k3sm benchmarks and records their figures in bench/RESULTS.md.
#
#   bench/run.sh [controlplane|runtime|pods|proxy|podnet|mesh|dns|dns-coredns|datastore|join|failover|all]...    (default: all)
#
# `all` is every benchmark but dns-coredns, which builds CoreDNS from its own
# module (bench/coredns: downloads it on first use) and needs root.
#
# `make bench` builds the binaries and runs this with K3SM_BIN set.
# Environment (all optional):
#   K3SM_BIN              k3sm binary to measure (default: bin/k3sm)
#   K3SM_BENCH_ROUNDS     control plane: start rounds (default 5)
#   K3SM_BENCH_IDLE       control plane: idle time before memory is read (default 60s)
#   K3SM_BENCH_RESULTS    file to record results in (default bench/RESULTS.md; empty: print only)
#   K3SM_BENCH_NOTE       control plane: a line for the report (e.g. how the binary was built)
#   K3SM_BENCH_ARGS       extra flags for bench/controlplane (see: go run ./bench/controlplane -help)
#   K3SM_BENCH_PODS_ARGS  extra flags for bench/pods (see: go run ./bench/pods -help)
#   K3SM_BENCH_PROXY_ARGS extra flags for bench/proxy (see: go run ./bench/proxy -help)
#   K3SM_BENCH_PODNET_ARGS extra flags for bench/podnet (see: go run ./bench/podnet -help)
#   K3SM_BENCH_MESH_ARGS  extra flags for bench/mesh (see: go run ./bench/mesh -help)
#   K3SM_BENCH_DNS_ARGS   extra flags for bench/dns, in both dns targets (see: go run ./bench/dns -help)
#   K3SM_BENCH_DATASTORE_ARGS extra flags for bench/datastore (see: go run ./bench/datastore -help)
#   K3SM_BENCH_JOIN_ARGS  extra flags for bench/join (see: go run ./bench/join -help)
#   K3SM_BENCH_FAILOVER_ARGS extra flags for bench/failover (see: go run ./bench/failover -help)
# The runtime benchmark (bench/runtime) reads its own K3SM_BENCH_* variables.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
export K3SM_BIN=${K3SM_BIN:-$PWD/bin/k3sm}
ROUNDS=${K3SM_BENCH_ROUNDS:-5}
IDLE=${K3SM_BENCH_IDLE:-60s}
RESULTS=${K3SM_BENCH_RESULTS-bench/RESULTS.md}
mkdir -p _output/bench

# in_netns runs a command in a network namespace of its own (only lo) when
# root: a k3sm server run as root gives pods addresses (100.64.0.0/10) and
# Service addresses of its own, and their traffic must stay in a namespace
# the benchmark made, never reach the machine's network.
in_netns() {
	if [[ $(id -u) == 0 ]]; then
		unshare --net -- sh -c 'ip link set lo up && exec "$@"' sh "$@"
	else
		"$@"
	fi
}

controlplane() {
	if [[ ! -x $K3SM_BIN ]]; then
		echo "bench: $K3SM_BIN is missing; build it with 'make bin/k3sm' or set K3SM_BIN" >&2
		return 1
	fi
	# A small stdlib-only program: builds in seconds, links nothing of the control plane.
	$GO build -o _output/bench/controlplane ./bench/controlplane
	local invocation="bench/run.sh controlplane"
	if [[ $ROUNDS != 5 ]]; then invocation="K3SM_BENCH_ROUNDS=$ROUNDS $invocation"; fi
	if [[ $IDLE != 60s ]]; then invocation="K3SM_BENCH_IDLE=$IDLE $invocation"; fi
	if [[ $K3SM_BIN != "$PWD/bin/k3sm" ]]; then invocation="K3SM_BIN=$K3SM_BIN $invocation"; fi
	# shellcheck disable=SC2086 # K3SM_BENCH_ARGS is a list of flags
	in_netns _output/bench/controlplane -bin "$K3SM_BIN" -rounds "$ROUNDS" -idle "$IDLE" \
		-results "$RESULTS" -invocation "$invocation" -note "${K3SM_BENCH_NOTE:-}" ${K3SM_BENCH_ARGS:-} |
		tee _output/bench/controlplane.md
}

runtime() {
	# Owned by bench/runtime: pod start and density (issue 3).
	K3SM_BENCH_RUNTIME=1 $GO test -count=1 -v -timeout 60m ./bench/runtime/ 2>&1 | tee _output/bench/runtime.log
}

pods() {
	# Owned by bench/pods: pod start through the whole server vs the --node-instant floor and the
	# --node-instant-writes fair floor (issue 35), density (issue 3),
	# and vs a peer node, an upstream kubelet + containerd + runc on the real server's control plane
	# (issue 12; root only, in this network namespace; its programs come from bench/peer-bin.sh or
	# `make node-image`, else it is skipped with a message; -peer=false in K3SM_BENCH_PODS_ARGS skips it).
	if [[ ! -x $K3SM_BIN ]]; then
		echo "bench: $K3SM_BIN is missing; build it with 'make bin/k3sm bin/k3sm-runtimed bin/k3sm-shim bin/k3sm-netd' or set K3SM_BIN" >&2
		return 1
	fi
	$GO build -o _output/bench/pods ./bench/pods
	local invocation="bench/run.sh pods"
	if [[ -n ${K3SM_BENCH_PODS_ARGS:-} ]]; then invocation="K3SM_BENCH_PODS_ARGS='$K3SM_BENCH_PODS_ARGS' $invocation"; fi
	if [[ $K3SM_BIN != "$PWD/bin/k3sm" ]]; then invocation="K3SM_BIN=$K3SM_BIN $invocation"; fi
	# shellcheck disable=SC2086 # K3SM_BENCH_PODS_ARGS is a list of flags
	in_netns _output/bench/pods -bin "$K3SM_BIN" -results "$RESULTS" -invocation "$invocation" -note "${K3SM_BENCH_NOTE:-}" \
		${K3SM_BENCH_PODS_ARGS:-} | tee _output/bench/pods.md
}

proxy() {
	# Owned by bench/proxy: the Service proxy against a direct loopback connection. It needs no
	# k3sm binary (the proxy runs in-process over a fake clientset) and prints only: its figures
	# are recorded in bench/RESULTS.md by hand.
	$GO build -o _output/bench/proxy ./bench/proxy
	# shellcheck disable=SC2086 # K3SM_BENCH_PROXY_ARGS is a list of flags
	_output/bench/proxy ${K3SM_BENCH_PROXY_ARGS:-} | tee _output/bench/proxy.md
}

podnet() {
	# Owned by bench/podnet: pod→pod and ClusterIP traffic over the real dataplane and Service proxy,
	# pod network setup through k3sm-netd, and the time from an EndpointSlice change to traffic following
	# it on the relay and in the kernel (-rounds 0 / -pods 0 / -follows 0 in K3SM_BENCH_PODNET_ARGS skip a part). Needs root (it skips with a message otherwise); it
	# re-runs itself under `unshare --net --mount`, so it touches nothing of the machine's network.
	# Prints only: its figures are recorded in bench/RESULTS.md by hand.
	$GO build -o _output/bench/podnet ./bench/podnet
	# shellcheck disable=SC2086 # K3SM_BENCH_PODNET_ARGS is a list of flags
	_output/bench/podnet ${K3SM_BENCH_PODNET_ARGS:-} | tee _output/bench/podnet.md
}

mesh() {
	# Owned by bench/mesh: pod→pod across two k3sm nodes over the WireGuard mesh (internal/netd/dataplane's
	# EnsureMesh and SetMeshPeers, wireguard-go in-process) against a bare wireguard-go tunnel (the floor)
	# and same-node pod→pod, side by side: one TCP stream's throughput and 1-byte round trips. Needs root
	# (it skips with a message otherwise) and /dev/net/tun; it re-runs itself under `unshare --net --mount`
	# and makes every node in a network namespace of its own, so it touches nothing of the machine's
	# network. Needs no k3sm binary. Writes its section of bench/RESULTS.md.
	$GO build -o _output/bench/mesh ./bench/mesh
	local invocation="bench/run.sh mesh"
	if [[ -n ${K3SM_BENCH_MESH_ARGS:-} ]]; then invocation="K3SM_BENCH_MESH_ARGS='$K3SM_BENCH_MESH_ARGS' $invocation"; fi
	# shellcheck disable=SC2086 # K3SM_BENCH_MESH_ARGS is a list of flags
	_output/bench/mesh -results "$RESULTS" -invocation "$invocation" ${K3SM_BENCH_MESH_ARGS:-} | tee _output/bench/mesh.md
}

dns() {
	# Owned by bench/dns: queries/s of the node's resolver on one core over a fake clientset of
	# 1000 Services. Needs no k3sm binary; prints only (figures go in bench/RESULTS.md by hand).
	$GO build -o _output/bench/dns ./bench/dns
	# shellcheck disable=SC2086 # K3SM_BENCH_DNS_ARGS is a list of flags
	_output/bench/dns ${K3SM_BENCH_DNS_ARGS:-} | tee _output/bench/dns.md
}

dns_coredns() {
	# bench/dns -cluster: the resolver and CoreDNS (built from its Go module, bench/coredns, with
	# only bind/errors/cache/kubernetes) side by side, both pinned to CPU 0 with GOMAXPROCS=1,
	# reading one `k3sm server --pod-network=host` that bench/dns starts in a network namespace of
	# its own. Needs root (it skips with a message otherwise) and k3sm-shim beside K3SM_BIN.
	# Prints only.
	if [[ ! -x $K3SM_BIN ]]; then
		echo "bench: $K3SM_BIN is missing; build it with 'make bin/k3sm bin/k3sm-shim' or set K3SM_BIN" >&2
		return 1
	fi
	$GO build -o _output/bench/dns ./bench/dns
	(cd bench/coredns && $GO build -trimpath -o ../../_output/bench/coredns .)
	# shellcheck disable=SC2086 # K3SM_BENCH_DNS_ARGS is a list of flags
	_output/bench/dns -cluster -cpu 0 -k3sm-bin "$K3SM_BIN" -coredns _output/bench/coredns ${K3SM_BENCH_DNS_ARGS:-} |
		tee _output/bench/dns-coredns.md
}

datastore() {
	# Owned by bench/datastore: one API load on the embedded SQLite, PostgreSQL, MariaDB, etcd and the embedded etcd member
	# (issue 32), side by side, each a fresh server on a database started here (Debian's postgresql
	# and mariadb-server must be installed). Writes its section of bench/RESULTS.md.
	if [[ ! -x $K3SM_BIN ]]; then
		echo "bench: $K3SM_BIN is missing; build it with 'make bin/k3sm bin/k3sm-runtimed bin/k3sm-shim' or set K3SM_BIN" >&2
		return 1
	fi
	$GO build -o _output/bench/datastore ./bench/datastore
	# shellcheck disable=SC2086 # K3SM_BENCH_DATASTORE_ARGS is a list of flags
	in_netns _output/bench/datastore -bin "$K3SM_BIN" -results "$RESULTS" -invocation "bench/run.sh datastore" \
		${K3SM_BENCH_DATASTORE_ARGS:-} | tee _output/bench/datastore.md
}

join() {
	# Owned by bench/join: `k3sm agent` start -> Node Ready over fresh joins (p50), and the memory of
	# an idle agent beside the server's own node (issue 31). Needs root (it fails with a message
	# otherwise): the server runs in this network namespace, each agent in one bench/join makes
	# (ip netns add), plugged by a veth pair into a bridge here; it deletes them at exit. Writes its
	# section of bench/RESULTS.md.
	if [[ ! -x $K3SM_BIN ]]; then
		echo "bench: $K3SM_BIN is missing; build it with 'make bin/k3sm bin/k3sm-runtimed bin/k3sm-shim bin/k3sm-netd' or set K3SM_BIN" >&2
		return 1
	fi
	$GO build -o _output/bench/join ./bench/join
	local invocation="bench/run.sh join"
	if [[ -n ${K3SM_BENCH_JOIN_ARGS:-} ]]; then invocation="K3SM_BENCH_JOIN_ARGS='$K3SM_BENCH_JOIN_ARGS' $invocation"; fi
	if [[ $K3SM_BIN != "$PWD/bin/k3sm" ]]; then invocation="K3SM_BIN=$K3SM_BIN $invocation"; fi
	# shellcheck disable=SC2086 # K3SM_BENCH_JOIN_ARGS is a list of flags
	in_netns _output/bench/join -bin "$K3SM_BIN" -results "$RESULTS" -invocation "$invocation" \
		${K3SM_BENCH_JOIN_ARGS:-} | tee _output/bench/join.md
}

failover() {
	# Owned by bench/failover: kill -9 of the server holding the controllers' leases -> the first write
	# through an agent's load balancer (internal/agent/apilb), p50 over 5 kills in each of two modes
	# (the process tree killed; the machine's link down first, then killed), and no acknowledged write
	# lost (issue 32). Needs root (it exits 2 otherwise) and Debian's postgresql: three servers with
	# --disable-agent on one PostgreSQL, each in a network namespace bench/failover makes (ip netns add),
	# plugged by a veth pair into a bridge here; it deletes them at exit. Writes its section of
	# bench/RESULTS.md.
	if [[ ! -x $K3SM_BIN ]]; then
		echo "bench: $K3SM_BIN is missing; build it with 'make bin/k3sm' or set K3SM_BIN" >&2
		return 1
	fi
	$GO build -o _output/bench/failover ./bench/failover
	local invocation="bench/run.sh failover"
	if [[ -n ${K3SM_BENCH_FAILOVER_ARGS:-} ]]; then invocation="K3SM_BENCH_FAILOVER_ARGS='$K3SM_BENCH_FAILOVER_ARGS' $invocation"; fi
	if [[ $K3SM_BIN != "$PWD/bin/k3sm" ]]; then invocation="K3SM_BIN=$K3SM_BIN $invocation"; fi
	# shellcheck disable=SC2086 # K3SM_BENCH_FAILOVER_ARGS is a list of flags
	in_netns _output/bench/failover -bin "$K3SM_BIN" -results "$RESULTS" -invocation "$invocation" \
		${K3SM_BENCH_FAILOVER_ARGS:-} | tee _output/bench/failover.md
}

targets=("$@")
if [[ ${#targets[@]} -eq 0 || ${targets[0]} == all ]]; then targets=(controlplane runtime pods proxy podnet mesh dns datastore join failover); fi
failed=()
for t in "${targets[@]}"; do
	case $t in
	controlplane | runtime | pods | proxy | podnet | mesh | dns | dns-coredns | datastore | join | failover)
		echo "=== bench: $t" >&2
		"${t//-/_}" || failed+=("$t")
		;;
	*)
		echo "bench: unknown benchmark '$t'; choose controlplane, runtime, pods, proxy, podnet, mesh, dns, dns-coredns, datastore, join, failover or all" >&2
		exit 2
		;;
	esac
done
if [[ ${#failed[@]} -gt 0 ]]; then
	echo "bench: failed: ${failed[*]}" >&2
	exit 1
fi
