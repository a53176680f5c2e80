//go:build linux

// Command mesh benchmarks k3sm's WireGuard mesh (internal/netd/dataplane's
// MeshPlane) against its floor, side by side in one run:
//
//   - k3sm mesh, cross-node: two k3sm nodes, each a network namespace with
//     its own dataplane (bridge, pods, mesh device), joined by a veth pair;
//     traffic from a pod on node A to a pod on node B.
//   - bare wireguard-go: two namespaces joined by a veth pair, each with
//     wireguard-go on a TUN link and nothing else; traffic between their
//     tunnel addresses. Both tunnels run wireguard-go in this process: the
//     same code, so the ratio is what k3sm adds around it.
//   - same node: from the same pod on node A to another pod on node A,
//     over the bridge.
//
// Each of -rounds rounds measures every path, rotating which goes first:
// one TCP stream's throughput (the client writes for -duration, the server
// counts) and -pings 1-byte round trips on one connection. The report
// shows medians and the ratios mesh ÷ bare (goal: ≥ 0.9× throughput) and
// mesh ÷ same node.
//
// It needs root. The program re-executes itself under `unshare --net
// --mount`, so the whole process runs in a fresh network namespace, and
// the namespaces it creates for the nodes, pods and the bare tunnel are
// bind-mounted in a private mount namespace that dies with it. Every
// socket is on an address inside those namespaces; nothing touches the
// machine's network. It removes what it made at exit, also on an error,
// and the outer process removes the temp dir however the inner one ends.
// It is a benchmark, not a test: nothing here asserts a figure.
//
//	go run ./bench/mesh    (or: bench/run.sh mesh)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/bench/internal/isolated"

	"github.com/k3sm-dev/k3sm/bench/internal/resultsfile"
)

// prog runs in namespaces of its own (bench/internal/isolated).
const prog = isolated.Program("mesh")

type options struct {
	rounds     int
	duration   time.Duration
	chunk      int
	pings      int
	mtu        int
	results    string
	invocation string
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 5, "rounds; each measures every path (k3sm mesh, bare wireguard-go, same node)")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "how long the client writes in each throughput measurement")
	flag.IntVar(&o.chunk, "chunk", 128<<10, "bytes per write in the throughput measurement")
	flag.IntVar(&o.pings, "pings", 2000, "1-byte round trips per latency measurement")
	flag.IntVar(&o.mtu, "mtu", 1380, "MTU of both WireGuard devices (k3sm's wire.MeshMTU is 1380)")
	flag.StringVar(&o.results, "results", "", "file whose bench/mesh section is replaced with the report (empty: print only)")
	flag.StringVar(&o.invocation, "invocation", "bench/run.sh mesh", "the command that reproduces this, for the report")
	flag.Parse()
	if o.rounds < 1 || o.rounds > 999 || o.duration < 100*time.Millisecond || o.chunk < 1 || o.chunk > 64<<20 || o.pings < 1 || o.mtu < 576 || o.mtu > 9000 {
		fmt.Fprintln(os.Stderr, "bench/mesh: -rounds must be 1 to 999, -duration at least 100ms, -chunk 1 to 64 MiB, -pings at least 1, -mtu 576 to 9000")
		os.Exit(2)
	}
	if dir := prog.InnerDir(); dir != "" {
		if err := inner(dir, o); err != nil {
			fmt.Fprintln(os.Stderr, "bench/mesh:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(outer())
}

// outer checks what the benchmark needs, and runs this program again in
// fresh network and mount namespaces with a temp dir it removes afterwards.
func outer() int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/mesh: skipped: needs root (it creates network namespaces, veths, TUN links and nftables rules; run it with sudo)")
		return 0
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		fmt.Fprintln(os.Stderr, "bench/mesh: needs /dev/net/tun (the TUN driver) for wireguard-go:", err)
		return 1
	}
	return prog.Reexec()
}

// inner is the benchmark proper, in the namespaces outer made.
func inner(dir string, o options) (err error) {
	if err := prog.CheckIsolated(); err != nil {
		return err
	}
	m := collectMachine()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()

	var cl cleanups
	defer func() {
		if cerr := cl.run(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
	}()
	mc, err := buildMesh(dir, o, &cl)
	if err != nil {
		return fmt.Errorf("k3sm mesh: %w", err)
	}
	fmt.Fprintf(os.Stderr, "bench/mesh: k3sm nodes, pods and mesh set up in %.0f ms\n", ms(mc.setup))
	bare, err := buildBare(dir, o, &cl)
	if err != nil {
		return fmt.Errorf("bare wireguard-go: %w", err)
	}
	fmt.Fprintf(os.Stderr, "bench/mesh: bare wireguard-go tunnel set up in %.0f ms\n", ms(bare.setup))

	paths := [nPaths]path{
		pathMesh:     {clientNS: mc.a1.NetNS, serverNS: mc.b1.NetNS, server: netip.AddrPortFrom(mc.b1.IP, serverPort)},
		pathBare:     {clientNS: bare.ns[0], serverNS: bare.ns[1], server: netip.AddrPortFrom(bareTunnel[1], serverPort)},
		pathSameNode: {clientNS: mc.a1.NetNS, serverNS: mc.a2.NetNS, server: netip.AddrPortFrom(mc.a2.IP, serverPort)},
	}
	rounds, err := runRounds(ctx, paths, o)
	if err != nil {
		return err
	}
	r := result{o: o, m: m, loadEnd: loadAvg(), mesh: mc, bare: bare, rounds: rounds}
	r.status, r.statusErr = mc.nodes[0].mp().MeshStatus()
	r.statusTime = time.Now()
	report := render(r)
	fmt.Print(report)
	if o.results != "" {
		if err := resultsfile.WriteSection(o.results, beginMark, endMark, report); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench/mesh: recorded in %s\n", o.results)
	}
	return nil
}
