#!/usr/bin/env bash
# make conformance: the upstream [Conformance] specs of e2e.test at the
# pinned Kubernetes version against a two-node k3sm (a server and an agent,
# each in a network namespace this script makes, joined by a bridge of its
# own), as Sonobuoy's certified-conformance mode runs them: ginkgo -p over
# every [Conformance] spec; ginkgo runs the [Serial] ones alone at the end.
# Reports go to _output/conformance/; hack/conformance/summary turns them
# into the table in docs/conformance.md.
#
# Environment:
#   CONFORMANCE_FOCUS   ginkgo focus regexp (default '\[Conformance\]')
#   CONFORMANCE_SKIP    ginkgo skip regexp (default none: nothing skipped)
#   CONFORMANCE_PROCS   parallel ginkgo processes (default 4)
#   CONFORMANCE_OUT     report directory (default _output/conformance)
#   CONFORMANCE_STATE   node data dirs (default /var/lib/k3sm-conformance)
#   CONFORMANCE_SUBNET  192.168.N.0/24 of the nodes' bridge (default 90)
#   CONFORMANCE_TIMEOUT ginkgo's suite timeout (default 3h)
#   CONFORMANCE_SERVER_ARGS extra `k3sm server` flags (e.g. for the rootless run)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
FOCUS="${CONFORMANCE_FOCUS:-\[Conformance\]}"
SKIP="${CONFORMANCE_SKIP:-}"
PROCS="${CONFORMANCE_PROCS:-4}"
OUT="$(mkdir -p "${CONFORMANCE_OUT:-_output/conformance}" && cd "${CONFORMANCE_OUT:-_output/conformance}" && pwd)"
STATE="${CONFORMANCE_STATE:-/var/lib/k3sm-conformance}"
SUBNET="${CONFORMANCE_SUBNET:-90}"
TIMEOUT="${CONFORMANCE_TIMEOUT:-3h}"
REGISTRY=127.0.0.1:5000
# As kind does for its conformance runs: a build machine's disk is often
# past kubelet's default thresholds, and a disk-pressure taint would keep
# every pod off both nodes.
# Image GC likewise: past 85% of the disk it would remove the test images
# loaded before the run, which no registry then serves.
EVICTION="--eviction-hard=nodefs.available<1Mi,imagefs.available<1Mi,nodefs.inodesFree<1%"
IMAGEGC="--image-gc-high-threshold=100 --image-gc-low-threshold=99"

log() { echo "conformance: $(date -u +%H:%M:%S) $*" >&2; }
die() { log "error: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root: each node runs in a network namespace of its own (sudo make conformance)"
for c in ip go debootstrap; do
	command -v "$c" >/dev/null || die "$c is not installed (apt-get install iproute2 debootstrap; Go from go.dev)"
done

log "tools: e2e.test, ginkgo, kubectl at the pinned version (cached; the first build takes ~15 min)"
tools="$(hack/conformance/tools.sh | tail -1)"
mod="$(dirname "$tools")/mod"
log "k3sm binaries"
make --no-print-directory bin/k3sm bin/k3sm-runtimed bin/k3sm-shim bin/k3sm-netd bin/k3sm-helm >&2
k3sm="$root/bin/k3sm"
log "test images (cached; the first build debootstraps a Debian root)"
images="$(dirname "$tools")/images"
go run ./hack/conformance/images -out "$images" -registry "$REGISTRY" -module "$mod"

ns0="k3sm-cf-server" ns1="k3sm-cf-agent" br="k3smcf$SUBNET"
ip0="192.168.$SUBNET.2" ip1="192.168.$SUBNET.3"
pids=()
# Pods' shims outlive their node (as they outlive a restart of it): end
# them and everything under them, as a machine being switched off would.
kill_pods() {
	local all=($(pgrep -f "k3sm-shim $STATE/" || true)) i=0 kids
	while [ $i -lt ${#all[@]} ]; do
		kids=$(cat /proc/"${all[$i]}"/task/*/children 2>/dev/null || true)
		all+=($kids)
		i=$((i + 1))
	done
	[ ${#all[@]} -gt 0 ] && kill -KILL "${all[@]}" 2>/dev/null
	return 0
}
cleanup() {
	set +e
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do
		for _ in $(seq 60); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
		kill -KILL "$p" 2>/dev/null
	done
	kill_pods
	mkdir -p "$OUT/logs"
	for n in server agent; do
		[ -d "$STATE/$n/logs" ] && cp -r "$STATE/$n/logs" "$OUT/logs/$n"
	done
	ip netns del "$ns0" 2>/dev/null; ip netns del "$ns1" 2>/dev/null; ip link del "$br" 2>/dev/null
	ip link del "k3smcf$SUBNET-0" 2>/dev/null; ip link del "k3smcf$SUBNET-1" 2>/dev/null
	[ -n "${fwd:-}" ] && iptables -D FORWARD -i "$br" -o "$br" -j ACCEPT
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "nodes: $ns0 ($ip0) and $ns1 ($ip1) on bridge $br"
kill_pods
ip netns del "$ns0" 2>/dev/null || true
ip netns del "$ns1" 2>/dev/null || true
ip link del "$br" 2>/dev/null || true
ip link del "k3smcf$SUBNET-0" 2>/dev/null || true
ip link del "k3smcf$SUBNET-1" 2>/dev/null || true
ip link add "$br" type bridge
ip link set "$br" up
# With br_netfilter loaded, bridged frames cross iptables' FORWARD chain,
# whose policy Docker sets to DROP: let the nodes' bridge through.
if command -v iptables >/dev/null && [ "$(sysctl -n net.bridge.bridge-nf-call-iptables 2>/dev/null)" = 1 ]; then
	iptables -I FORWARD -i "$br" -o "$br" -j ACCEPT
	fwd=1
fi
i=0
for pair in "$ns0:$ip0" "$ns1:$ip1"; do
	ns="${pair%%:*}" addr="${pair#*:}"
	ip netns add "$ns"
	ip link add "k3smcf$SUBNET-$i" type veth peer name eth0 netns "$ns"
	ip link set "k3smcf$SUBNET-$i" master "$br" up
	ip -n "$ns" addr add "$addr/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" link set lo up
	i=$((i + 1))
done

rm -rf "$STATE" "$OUT"/*.xml "$OUT"/*.json "$OUT/logs" "$OUT/e2e.log"
mkdir -p "$STATE/server" "$STATE/agent"
log "loading $(wc -l < "$images/images.txt") images into both nodes' stores"
for n in server agent; do
	for tar in "$images"/*.tar; do
		"$k3sm" image load --data-dir "$STATE/$n" -i "$tar" >/dev/null 2>"$OUT/load.err" || die "k3sm image load $tar: $(cat "$OUT/load.err")"
	done
done

log "starting the server"
ip netns exec "$ns0" "$k3sm" server --data-dir "$STATE/server" --node-name server \
	--bind-address 0.0.0.0 --advertise-address "$ip0" --registry-port 5000 \
	"$EVICTION" $IMAGEGC ${CONFORMANCE_SERVER_ARGS:-} >"$OUT/server.out" 2>&1 &
pids+=($!)
kc="$STATE/server/admin.kubeconfig"
for _ in $(seq 120); do
	[ -f "$kc" ] && ip netns exec "$ns0" "$tools/kubectl" --kubeconfig "$kc" get node server >/dev/null 2>&1 && break
	kill -0 "${pids[0]}" 2>/dev/null || die "the server exited: $(tail -20 "$OUT/server.out")"
	sleep 1
done
token="$(ip netns exec "$ns0" "$k3sm" token create --data-dir "$STATE/server" --description conformance | tail -1)"
log "starting the agent"
ip netns exec "$ns1" "$k3sm" agent --data-dir "$STATE/agent" --node-name agent \
	--server "https://$ip0:9345" --token "$token" "$EVICTION" $IMAGEGC >"$OUT/agent.out" 2>&1 &
pids+=($!)
log "waiting for both nodes to be Ready"
for _ in $(seq 120); do
	ip netns exec "$ns0" "$tools/kubectl" --kubeconfig "$kc" get node agent >/dev/null 2>&1 && break
	kill -0 "${pids[1]}" 2>/dev/null || die "the agent exited: $(tail -20 "$OUT/agent.out")"
	sleep 1
done
ip netns exec "$ns0" "$tools/kubectl" --kubeconfig "$kc" wait --for=condition=Ready node/server node/agent --timeout=5m >&2 ||
	die "nodes not Ready: $(tail -20 "$OUT/agent.out")"
ip netns exec "$ns0" "$tools/kubectl" --kubeconfig "$kc" get nodes -o wide >&2

log "running: focus '$FOCUS' skip '$SKIP', $PROCS processes; the log is $OUT/e2e.log"
start=$(date +%s)
set +e
ip netns exec "$ns0" env KUBE_TEST_REPO_LIST="$images/repo-list.yaml" \
	"$tools/ginkgo" -p --procs="$PROCS" --timeout="$TIMEOUT" --no-color \
	--focus="$FOCUS" ${SKIP:+--skip="$SKIP"} \
	--output-dir="$OUT" --junit-report=junit.xml --json-report=report.json \
	"$tools/e2e.test" -- \
	--provider=skeleton --kubeconfig="$kc" --kubectl-path="$tools/kubectl" \
	--report-dir="$OUT" --disable-log-dump >"$OUT/e2e.log" 2>&1
rc=$?
set -e
echo "$(( $(date +%s) - start ))" > "$OUT/wall-seconds"
git rev-parse HEAD > "$OUT/commit"
log "ginkgo exited $rc after $(cat "$OUT/wall-seconds")s; summary:"
go run ./hack/conformance/summary "$OUT/report.json" >&2 || true
exit $rc
