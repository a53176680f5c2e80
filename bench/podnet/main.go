//go:build linux

// Command podnet benchmarks the pod network k3sm-netd builds, through the
// real data path (internal/netd/dataplane), against its floors:
//
//   - traffic: a bulk upload (bytes in fixed-size writes, acknowledged by
//     the backend once all arrived) and a 1-byte ping-pong, from a client
//     in pod A's network namespace to a server in pod B's, directly
//     (pod→pod over the veths and the node's bridge), through a ClusterIP
//     of the node's Service proxy's userspace relay (internal/agent/proxy,
//     in the "host" namespace, over a fake clientset) and through a
//     ClusterIP the same proxy puts in the kernel (its Kernel path, applied
//     by the dataplane's SetServices as k3sm-netd does); the floor is the same
//     client and server over one loopback interface (127.0.0.1 inside pod
//     B's namespace). The peer (-kube-proxy): a second ClusterIP served by
//     kube-proxy in nftables mode, from k8s.io/kubernetes at the pinned
//     version, over its own fake clientset (kubeproxy.go). Each round
//     measures every path, rotating which goes first; the report shows
//     medians over the rounds and the ratios.
//   - setup: what a pod start pays for its network, SetupPod and
//     TeardownPod through the real k3sm-netd server and client over its
//     unix socket, against the dataplane's AddPod and DelPod called
//     directly: one pod at a time, interleaved, and a burst from several
//     goroutines.
//   - follows: how long traffic takes to follow an EndpointSlice change,
//     on the relay and in the kernel side by side. Pods A and B each
//     answer a connection with their name; a Service's one endpoint moves
//     between them (an Update in the fake clientset), and a client in
//     pod C connects to the ClusterIP again and again (a new connection
//     each try) until the new pod answers (follow.go).
//
// It needs root. The program re-executes itself under `unshare --net
// --mount`, so the whole process runs in a fresh network namespace that
// serves as the node's "host" (bind-mounted on a file in a temp dir and
// passed as Options.HostNSPath), and every bind mount lives in a private
// mount namespace that dies with it. Every socket is on 127.0.0.0/8 or on
// an address inside those namespaces; nothing touches the machine's
// network. The outer process removes the temp dir when the inner one ends,
// however it ends. It is a benchmark, not a test: nothing here asserts a
// figure.
//
//	go run ./bench/podnet    (or: bench/run.sh podnet)
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/bench/internal/isolated"

	"golang.org/x/sys/unix"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
)

// prog runs in namespaces of its own (bench/internal/isolated).
const prog = isolated.Program("podnet")

type options struct {
	rounds      int
	bytes       int64
	chunk       int
	pings       int
	pods        int
	workers     int
	burstRounds int
	kubeProxy   bool
	follows     int
}

// The node, as the server would configure it (issue: 100.64.7.0/24).
var node = dataplane.Node{
	CIDR:        netip.MustParsePrefix("100.64.7.0/24"),
	Gateway:     netip.MustParseAddr("100.64.7.1"),
	Bridge:      "k3sm0",
	ServiceCIDR: netip.MustParsePrefix("10.96.0.0/16"),
	ClusterCIDR: netip.MustParsePrefix("100.64.0.0/10"),
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 5, "traffic rounds; each measures loopback, pod→pod and the ClusterIPs (relay, nftables, kube-proxy); 0 skips the traffic")
	flag.Int64Var(&o.bytes, "bytes", 1<<30, "bytes uploaded per throughput measurement")
	flag.IntVar(&o.chunk, "chunk", 64<<10, "bytes per write in the throughput measurement")
	flag.IntVar(&o.pings, "pings", 20000, "1-byte round trips per latency measurement")
	flag.IntVar(&o.pods, "pods", 100, "pods per setup measurement (one at a time, and per burst); 0 skips the setup measurement")
	flag.IntVar(&o.workers, "workers", 8, "goroutines setting up the pods of a burst")
	flag.IntVar(&o.burstRounds, "burst-rounds", 3, "burst rounds per path (0 skips the bursts)")
	flag.BoolVar(&o.kubeProxy, "kube-proxy", true, "also measure a ClusterIP served by kube-proxy in nftables mode (k8s.io/kubernetes at the pinned version, over a fake clientset)")
	flag.IntVar(&o.follows, "follows", 20, "EndpointSlice changes per path (relay, nftables) timed until a new connection reaches the new endpoint; 0 skips them")
	flag.Parse()
	if o.rounds < 0 || o.bytes < 1 || o.chunk < 1 || o.pings < 1 || o.pods < 0 || o.pods > 250 || o.workers < 1 || o.burstRounds < 0 || o.follows < 0 {
		fmt.Fprintln(os.Stderr, "bench/podnet: -bytes, -chunk, -pings, -workers must be at least 1; -pods 0 to 250; -rounds, -burst-rounds, -follows at least 0")
		os.Exit(2)
	}
	if o.rounds == 0 && o.pods == 0 && o.follows == 0 {
		fmt.Fprintln(os.Stderr, "bench/podnet: -rounds 0 -pods 0 -follows 0 leaves nothing to measure; set one of them above 0")
		os.Exit(2)
	}
	if dir := prog.InnerDir(); dir != "" {
		if err := inner(dir, o); err != nil {
			fmt.Fprintln(os.Stderr, "bench/podnet:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(outer())
}

// outer checks what the benchmark needs, and runs this program again in
// fresh network and mount namespaces with a temp dir it removes afterwards.
func outer() int {
	if runtime.GOOS != "linux" {
		fmt.Fprintln(os.Stderr, "bench/podnet: skipped: pods get network namespaces on Linux only")
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/podnet: skipped: needs root (it creates network namespaces, veths and nftables rules; run it with sudo)")
		return 0
	}
	return prog.Reexec()
}

// inner is the benchmark proper, in the namespaces outer made.
func inner(dir string, o options) (err error) {
	if err := prog.CheckIsolated(); err != nil {
		return err
	}
	loadStart := loadAvg()
	hostNS := filepath.Join(dir, "host")
	if err := bindOwnNetNS(hostNS); err != nil {
		return err
	}
	defer unmount(hostNS)
	if err := isolated.LoUp(hostNS); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()

	// Setup first: kube-proxy, once started for the traffic, runs (and
	// keeps its rules) until the process ends. A part set to 0 is skipped.
	var (
		st *setupResult
		tr *trafficResult
		fr *followResult
	)
	if o.pods > 0 {
		if st, err = setupBench(ctx, dir, hostNS, o); err != nil {
			return err
		}
	}
	if o.rounds > 0 {
		if tr, err = trafficBench(ctx, dir, hostNS, o); err != nil {
			return err
		}
	}
	if o.follows > 0 {
		if fr, err = followBench(ctx, dir, hostNS, o); err != nil {
			return err
		}
	}
	report(o, tr, st, fr, loadStart, loadAvg())
	return nil
}

// bindOwnNetNS bind-mounts the process's network namespace on path, which
// the dataplane opens as the node's "host".
func bindOwnNetNS(path string) error {
	if err := os.WriteFile(path, nil, 0o400); err != nil {
		return err
	}
	if err := unix.Mount("/proc/self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount the host namespace on %s: %w", path, err)
	}
	return nil
}

func unmount(path string) {
	unix.Unmount(path, unix.MNT_DETACH)
	os.Remove(path)
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// ms is a duration in milliseconds, for the setup figures.
func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
