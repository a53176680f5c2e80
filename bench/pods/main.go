// Command pods measures issue 3's figures through the whole k3sm server
// (control plane, Virtual Kubelet node, runtime daemon, shims):
//
//   - pod create -> Running, seen through a watch, one pod at a time, over a
//     burst of pods and over a Deployment, against two floors: a server
//     started with --node-instant, whose node marks pods Running without
//     starting anything (one status per pod: the API-only bound), and the
//     fair floor, started with --node-instant-writes, whose node also starts
//     nothing but makes a real start's API reads and writes (token, Pending
//     status, Pulled/Created/Started Events, Running), so real ÷ fair floor
//     is the node's own cost (issue 35). Each round starts with the next
//     mode so noise hits all.
//   - density: many pods of a small sleeping program on the one node; the
//     node must stay Ready; memory per pod beyond the workload (shim PSS plus
//     the growth of the runtime daemon and node processes); delete leaves
//     nothing behind.
//
// It starts the real binary (a private copy, so PSS is shared only among
// the measured processes) and talks to it with client-go only; everything
// listens on 127.0.0.1.
//
//	go run ./bench/pods -bin bin/k3sm -results bench/RESULTS.md
package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/k3sm-dev/k3sm/bench/internal/execfile"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/bench/internal/resultsfile"
)

type options struct {
	bin          string
	pods         int
	rounds       int
	singles      int
	deployRounds int
	// deployUpstream adds the upstreamRatesMode server to the Deployment rounds.
	deployUpstream bool
	fair           bool // run the fair floor (--node-instant-writes) beside the floor
	density        int
	creators       int
	qps            float64
	settle         time.Duration
	hold           time.Duration
	timeout        time.Duration
	stall          time.Duration
	results        string
	invocation     string
	note           string
	keep           bool
	peer           bool
	peerSet        bool // -peer given explicitly: a peer that cannot start is an error
	peerBin        string
}

// bench is one run: the private binaries, the image and its registry.
type bench struct {
	o     options
	work  string
	bin   string // private copy of k3sm
	shim  string // private copy of k3sm-shim, beside bin
	image string
	extra []string // extra server flags (--max-pods for the density run)
}

func main() {
	var o options
	def := os.Getenv("K3SM_BIN")
	if def == "" {
		def = "bin/k3sm"
	}
	flag.StringVar(&o.bin, "bin", def, "k3sm binary to measure; k3sm-shim must be beside it (default $K3SM_BIN or bin/k3sm)")
	flag.IntVar(&o.pods, "pods", 100, "pods per burst (and replicas of the Deployment)")
	flag.IntVar(&o.rounds, "rounds", 3, "burst rounds per mode; each round runs every mode, starting with the next one each round")
	flag.IntVar(&o.singles, "singles", 10, "single pods (no burst) per mode, one at a time, before the bursts (0: skip)")
	flag.IntVar(&o.deployRounds, "deploy-rounds", 1, "rounds of a Deployment with -pods replicas per mode (0: skip)")
	flag.BoolVar(&o.deployUpstream, "deploy-upstream-rates", true, "also run the Deployment rounds on another server whose scheduler and controller-manager "+
		"have upstream's client rates (--kube-*-arg=kube-api-qps=...) and whose node is instant like the floor's: the pacing before k3sm raised them, side by side")
	flag.BoolVar(&o.fair, "fair", true, "also run the single, burst and Deployment rounds on the fair floor: a server started with --node-instant-writes, "+
		"whose node makes a real start's API writes (token, Pending status, Pulled/Created/Started Events, Running) but starts nothing (issue 35)")
	flag.IntVar(&o.density, "density", 500, "pods for the density figure (0: skip); capped at what the node can take")
	flag.IntVar(&o.creators, "creators", 16, "goroutines creating pods")
	flag.Float64Var(&o.qps, "qps", 1000, "client QPS (burst twice that): the benchmark's client must not be the limit")
	flag.DurationVar(&o.settle, "settle", 30*time.Second, "idle time before each burst, so every burst meets an idle node (the node's work queues refill at 10 per second)")
	flag.DurationVar(&o.hold, "hold", 60*time.Second, "density: how long the pods run after all are Running (node readiness and lease are watched)")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "limit for all pods Running, or all gone, in one step")
	flag.DurationVar(&o.stall, "stall", 90*time.Second, "stop waiting for pods to be Running when none became Running for this long (the rest are reported as stuck)")
	flag.StringVar(&o.results, "results", "", "file whose `bench/pods` section is replaced with the report (empty: print only)")
	flag.StringVar(&o.invocation, "invocation", "", "the command that ran this, for the report")
	flag.StringVar(&o.note, "note", "", "a line for the report (e.g. how the binary was built)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, data dirs) after a successful run")
	flag.BoolVar(&o.peer, "peer", true, "also run the single and burst rounds on a peer: an upstream kubelet with containerd and runc joined to the real server's "+
		"control plane (needs root, a network namespace of its own as bench/run.sh gives, and the binaries: see -peer-bin); skipped with a message when "+
		"something is missing, unless -peer is given explicitly")
	flag.StringVar(&o.peerBin, "peer-bin", "", "directory with kubelet, containerd and containerd-shim-runc-v2 (and optionally pause) for the peer "+
		"(default: _output/bench/peer-bin, built by bench/peer-bin.sh, else klimax's node-image cache ~/.cache/klimax/node-image/bin-*)")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { o.peerSet = o.peerSet || f.Name == "peer" })
	if o.pods < 1 || o.creators < 1 || o.rounds < 0 || o.singles < 0 || o.deployRounds < 0 || o.density < 0 || o.rounds+o.singles+o.deployRounds+o.density == 0 {
		fmt.Fprintln(os.Stderr, "bench/pods: -pods and -creators must be at least 1; -rounds, -singles, -deploy-rounds and -density at least 0, not all 0")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/pods:", err)
		os.Exit(1)
	}
}

func (r *results) anyStuck() bool {
	for _, rs := range [][]*burstResult{r.singles, r.bursts, r.deploys} {
		for _, b := range rs {
			if len(b.Stuck) > 0 {
				return true
			}
		}
	}
	return r.density != nil && len(r.density.Stuck) > 0
}

// results is everything the report shows.
type results struct {
	singles []*burstResult
	bursts  []*burstResult
	deploys []*burstResult
	density *densityResult
	peer    string // what the peer ran (versions), or why it did not
	peerRan bool
}

func run(ctx context.Context, o options) (err error) {
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	shim := filepath.Join(filepath.Dir(bin), "k3sm-shim")
	runtimed := filepath.Join(filepath.Dir(bin), "k3sm-runtimed")
	for _, f := range []string{bin, runtimed, shim} {
		if st, err := os.Stat(f); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing or not executable: build with `make bin/k3sm bin/k3sm-runtimed bin/k3sm-shim` or pass -bin", f)
		}
	}
	m := collectMachine(bin)
	// Short path: the runtime's unix sockets live under the data dirs.
	work, err := os.MkdirTemp("", "k3sm-pods-")
	if err != nil {
		return err
	}
	b := &bench{o: o, work: work, bin: filepath.Join(work, "bin", "k3sm"), shim: filepath.Join(work, "bin", "k3sm-shim")}
	fmt.Printf("bench/pods: work dir %s\n", work)
	var servers []*server
	var res results
	var pr *peer
	var realSrv *server
	defer func() {
		if perr := pr.stop(realSrv); perr != nil && err == nil {
			err = perr
		}
		for _, s := range servers {
			if serr := s.stop(); serr != nil && err == nil {
				err = serr
			}
		}
		b.killLeftovers()
		// Logs of a run where a pod got stuck are evidence: keep them.
		if err == nil && !o.keep && !res.anyStuck() {
			os.RemoveAll(work)
		} else {
			fmt.Printf("bench/pods: logs and data dirs kept in %s\n", work)
		}
	}()
	if err := os.MkdirAll(filepath.Join(work, "bin"), 0o755); err != nil {
		return err
	}
	if err := execfile.Copy(bin, b.bin); err != nil {
		return err
	}
	if err := execfile.Copy(shim, b.shim); err != nil {
		return err
	}
	if err := execfile.Copy(runtimed, filepath.Join(work, "bin", "k3sm-runtimed")); err != nil {
		return err
	}
	// As root the server runs the pod network through k3sm-netd beside it.
	if netd := filepath.Join(filepath.Dir(bin), "k3sm-netd"); os.Geteuid() == 0 {
		if err := execfile.Copy(netd, filepath.Join(work, "bin", "k3sm-netd")); err != nil {
			return fmt.Errorf("%w: as root the server needs k3sm-netd beside k3sm: build it with `make bin/k3sm-netd`", err)
		}
	}
	var peerBins peerBins
	if o.peer && o.rounds+o.singles > 0 {
		if peerBins, err = findPeer(o.peerBin); err != nil {
			if o.peerSet {
				return fmt.Errorf("-peer: %w", err)
			}
			res.peer = "skipped: " + err.Error()
			fmt.Printf("bench/pods: peer %s\n", res.peer)
			peerBins.dir = "" // what was found before the error: no peer is started
		}
	} else if !o.peer {
		res.peer = "skipped (-peer=false)"
	}
	ref, stopRegistry, err := serveImage(work)
	if err != nil {
		return err
	}
	defer stopRegistry()
	b.image = ref

	// Every server gets the same flags; the floors' nodes ignore them.
	b.extra = extraFlags(b.bin, o.density+10)
	realSrv, err = startServer(ctx, b.bin, work, "real", float32(o.qps), b.extra)
	servers = append(servers, realSrv)
	if err != nil {
		return err
	}
	// The modes of the single, burst and Deployment rounds, in rotation.
	modes := []*server{realSrv}
	if o.rounds+o.singles+o.deployRounds > 0 {
		floorModes := []string{"floor"}
		if o.fair {
			floorModes = append(floorModes, "fair")
		}
		for _, mode := range floorModes {
			s, err := startServer(ctx, b.bin, work, mode, float32(o.qps), b.extra)
			servers = append(servers, s)
			if err != nil {
				return err
			}
			modes = append(modes, s)
		}
		fmt.Printf("bench/pods: %d servers up\n", len(modes))
	}
	for _, s := range modes {
		if err := b.warmUp(ctx, s); err != nil {
			return err
		}
	}
	floors := modes[1:]                             // stopped before the density run
	deployModes := append([]*server(nil), modes...) // the peer takes no part
	var peerSrv *server
	if peerBins.dir != "" {
		if pr, err = startPeer(ctx, peerBins, work, realSrv, strings.SplitN(ref, "/", 2)[0]); err != nil {
			return err
		}
		res.peer, res.peerRan = pr.versions, true
		peerSrv = &server{mode: "peer", node: peerNodeName, dir: pr.dir, peer: pr, cp: realSrv, rc: realSrv.rc, c: realSrv.c}
		if err := b.warmUp(ctx, peerSrv); err != nil {
			return err
		}
		modes = append(modes, peerSrv)
	}

	phase := func(kind string, rounds int, settle time.Duration, modes []*server) ([]*burstResult, error) {
		var out []*burstResult
		for r := 1; r <= rounds; r++ {
			for i, s := range roundOrder(modes, r) {
				sleep(ctx, settle)
				if err := s.alive(); err != nil {
					return nil, err
				}
				br, err := b.burst(ctx, s, kind, r)
				if err != nil {
					return nil, err
				}
				br.Order = i + 1
				out = append(out, br)
				fmt.Printf("bench/pods: %s round %d %-5s p50 %s p99 %s max %s (delete %s)\n", kind, r, s.mode,
					ms(pct(br.Lat, 0.50)), ms(pct(br.Lat, 0.99)), ms(pct(br.Lat, 1)), ms(br.Delete))
			}
		}
		return out, nil
	}
	// Single pods first, while the nodes' work queues are fresh.
	if res.singles, err = phase("single", o.singles, 2*time.Second, modes); err != nil {
		return err
	}
	if res.bursts, err = phase("pods", o.rounds, o.settle, modes); err != nil {
		return err
	}
	// The peer is stopped here: the Deployment measures the controller-manager
	// and the density run the real node's memory, with nothing else running.
	if err := pr.stop(realSrv); err != nil {
		return err
	}
	pr = nil
	var up *server
	if o.deployRounds > 0 && o.deployUpstream {
		// Started only now so it costs the other phases nothing; stopped
		// after. An instant node, as the floor's: a second real node would
		// share the pod network's bridge with the first, and the rates pace
		// the controllers, not the node.
		up, err = startServer(ctx, b.bin, work, upstreamRatesMode, float32(o.qps), append(append([]string(nil), b.extra...), upstreamRateFlags...))
		servers = append(servers, up)
		if err != nil {
			return err
		}
		if err := b.warmUp(ctx, up); err != nil {
			return err
		}
		deployModes = append(deployModes, up)
	}
	if res.deploys, err = phase("deployment", o.deployRounds, o.settle, deployModes); err != nil {
		return err
	}
	if err := up.stop(); err != nil {
		return err
	}
	if o.density > 0 {
		// The floors' servers are stopped so that the k3sm binary's pages
		// are shared by the same processes before and after the pods start.
		for _, s := range floors {
			if err := s.stop(); err != nil {
				return err
			}
		}
		if res.density, err = b.density(ctx, realSrv); err != nil {
			return err
		}
	}
	m.LoadEnd = loadAvg()

	report := renderReport(o, m, &res, b.extra)
	fmt.Print("\n" + report)
	if o.results != "" {
		if err := resultsfile.WriteSection(o.results, beginMark, endMark, report); err != nil {
			return err
		}
		fmt.Printf("bench/pods: recorded in %s\n", o.results)
	}
	return nil
}

// roundOrder is the order the modes run in round r (from 1): each round
// starts with the next mode, so with two they alternate.
func roundOrder(modes []*server, r int) []*server {
	k := (r - 1) % len(modes)
	return append(append([]*server(nil), modes[k:]...), modes[:k]...)
}

// killLeftovers kills, by pid, shims and workloads of this run that are
// still alive (after a failed run: shims outlive the server by design).
// The floors' nodes start none; they are looked for all the same.
func (b *bench) killLeftovers() {
	for _, mode := range []string{"real", "floor", "fair"} {
		for _, p := range classify(scan(), -1, b.bin, b.shim, filepath.Join(b.work, mode)) {
			if p.Role == "k3sm-shim" || p.Role == "workload" {
				syscall.Kill(p.Pid, syscall.SIGKILL)
			}
		}
	}
}
