// Command controlplane benchmarks the k3sm control plane: cold start of
// `k3sm server` side by side with its floor (kube-apiserver alone, started
// directly against kine with the flags the server uses), on fresh and warm
// data directories, and the memory of the idle server. It prints a Markdown
// report and, with -results, writes it into that file's "Control plane"
// section. It is a benchmark, not a test: nothing here asserts a figure.
//
//	go run ./bench/controlplane -bin bin/k3sm -rounds 5 -idle 60s -results bench/RESULTS.md
//
// It only talks to 127.0.0.1 and only starts, and stops, processes of its own.
package main

import (
	"flag"
	"fmt"
	"github.com/k3sm-dev/k3sm/bench/internal/execfile"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/bench/internal/resultsfile"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
)

type options struct {
	bin        string
	rounds     int
	idle       time.Duration
	poll       time.Duration
	timeout    time.Duration
	workDir    string
	keep       bool
	results    string
	privateBin bool
	floorMem   bool
	invocation string
	note       string
}

type bench struct {
	opts   options
	bin    string // the binary actually run (a private copy unless -private-bin=false)
	work   string
	logDir string
	fa     floorArgs
	// kubeletPortFlag: this binary's server has --kubelet-port (it runs a node).
	kubeletPortFlag bool

	mu   sync.Mutex
	live map[instance]bool
}

func main() {
	var o options
	defBin := os.Getenv("K3SM_BIN")
	if defBin == "" {
		defBin = "bin/k3sm"
	}
	flag.StringVar(&o.bin, "bin", defBin, "k3sm binary to measure (default $K3SM_BIN or bin/k3sm)")
	flag.IntVar(&o.rounds, "rounds", 5, "rounds; each starts k3sm and the floor on a fresh and then a warm data dir")
	flag.DurationVar(&o.idle, "idle", 60*time.Second, "idle time before memory is read")
	flag.DurationVar(&o.poll, "poll", 20*time.Millisecond, "health poll interval")
	flag.DurationVar(&o.timeout, "timeout", 4*time.Minute, "limit for one start to become healthy")
	flag.StringVar(&o.workDir, "work-dir", "", "directory for data dirs and logs (default: a new directory under $TMPDIR, removed at the end)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.StringVar(&o.results, "results", "", "Markdown file whose \"Control plane\" section is replaced by this report (empty: print only)")
	flag.BoolVar(&o.privateBin, "private-bin", true, "run a private copy of the binary so PSS is shared only among the measured processes")
	flag.BoolVar(&o.floorMem, "floor-memory", true, "also measure the idle memory of the floor (kine + kube-apiserver alone)")
	flag.StringVar(&o.invocation, "invocation", "", "the command that ran this benchmark, for the report")
	flag.StringVar(&o.note, "note", "", "a line for the report, e.g. how the binary was built")
	flag.Parse()
	if flag.NArg() > 0 {
		fatalf("unexpected arguments %q; see -help", flag.Args())
	}
	if o.rounds < 1 {
		fatalf("-rounds %d: need at least 1", o.rounds)
	}
	if o.poll <= 0 || o.idle < 0 || o.timeout <= 0 {
		fatalf("-poll and -timeout must be positive and -idle not negative")
	}
	if o.invocation == "" {
		o.invocation = strings.Join(os.Args, " ")
	}
	if err := runBench(o); err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench/controlplane: "+format+"\n", args...)
	os.Exit(1)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (b *bench) track(i instance) {
	b.mu.Lock()
	b.live[i] = true
	b.mu.Unlock()
}

func (b *bench) untrack(i instance) {
	b.mu.Lock()
	delete(b.live, i)
	b.mu.Unlock()
}

// stopInstance stops i and forgets it.
func (b *bench) stopInstance(i instance) error {
	err := i.stop()
	b.untrack(i)
	return err
}

func runBench(o options) error {
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() {
		return fmt.Errorf("-bin %s: not a file (build it with `make bin/k3sm`)", o.bin)
	}
	work := o.workDir
	if work == "" {
		// Short: kine's unix socket lives under the data dirs.
		if work, err = os.MkdirTemp("", "k3smb-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	b := &bench{opts: o, bin: bin, work: work, logDir: filepath.Join(work, "logs"), live: map[instance]bool{}}
	if err := os.MkdirAll(b.logDir, 0o700); err != nil {
		return err
	}

	// Ctrl-C stops what this benchmark started and keeps the work dir.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		progress("%v: stopping started processes; work dir kept: %s", s, work)
		b.mu.Lock()
		live := make([]instance, 0, len(b.live))
		for i := range b.live {
			live = append(live, i)
		}
		b.mu.Unlock()
		for _, i := range live {
			_ = i.stop()
		}
		os.Exit(130)
	}()

	info := collectMachine(bin)
	help, err := exec.Command(bin, "server", "--help").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s server --help: %v: %s", bin, err, help)
	}
	b.kubeletPortFlag = strings.Contains(string(help), "--kubelet-port")
	if o.privateBin {
		b.bin = filepath.Join(work, "k3sm")
		if err := execfile.Copy(bin, b.bin); err != nil {
			return err
		}
		// The runtime daemon looks for its shim, and the server for
		// k3sm-runtimed, k3sm-netd (the pod network as root) and k3sm-helm
		// (HelmCharts), next to the executable.
		for _, helper := range []string{"k3sm-runtimed", "k3sm-shim", "k3sm-netd", "k3sm-helm"} {
			if src := filepath.Join(filepath.Dir(bin), helper); fileExists(src) {
				if err := execfile.Copy(src, filepath.Join(work, helper)); err != nil {
					return err
				}
			}
		}
	}
	progress("work dir %s; binary %s", work, b.bin)

	res, err := b.measureAll()
	if err != nil {
		progress("failed; work dir kept for inspection: %s", work)
		return err
	}
	info.LoadEnd = loadAvg()
	report := renderReport(o, info, res)
	fmt.Print(report)
	if o.results != "" {
		if err := resultsfile.WriteSection(o.results, beginMark, endMark, report); err != nil {
			return err
		}
		progress("wrote the \"Control plane\" section of %s", o.results)
	}
	if o.keep || o.workDir != "" {
		progress("work dir kept: %s", work)
	} else {
		_ = os.RemoveAll(work)
	}
	return nil
}

// results is everything measured in one benchmark run.
type results struct {
	Template   *run
	Runs       []*run
	K3smMem    []memory
	K3smMemUp  *run
	FloorMem   []memory
	OtherUsers []int // other processes running the same binary during the memory reading
}

func (b *bench) measureAll() (*results, error) {
	res := &results{}
	// Template run: warms the page cache (discarded from the figures) and
	// records the exact kine and apiserver command lines for the floor.
	progress("template run (warm-up, not counted): k3sm server on a fresh data dir")
	tdir := filepath.Join(b.work, "template", "data")
	if err := os.MkdirAll(filepath.Dir(tdir), 0o700); err != nil {
		return nil, err
	}
	r, k, err := b.startK3sm(tdir)
	if err != nil {
		return nil, err
	}
	res.Template = r
	progress("  /readyz %s, all healthy %s (server says: apiserver ready after %s, up in %s)", ms(r.Readyz), ms(r.AllUp), r.SelfReady, r.SelfUp)
	if err := b.captureFloorArgs(k); err != nil {
		_ = b.stopInstance(k)
		return nil, err
	}
	if err := b.stopInstance(k); err != nil {
		return nil, err
	}

	for round := 1; round <= b.opts.rounds; round++ {
		order := []string{"k3sm", "floor"}
		if round%2 == 0 {
			order = []string{"floor", "k3sm"}
		}
		rdir := filepath.Join(b.work, fmt.Sprintf("r%d", round))
		if err := os.MkdirAll(rdir, 0o700); err != nil {
			return nil, err
		}
		if err := b.prepareFloorDir(filepath.Join(rdir, "floor")); err != nil {
			return nil, err
		}
		for _, warm := range []bool{false, true} {
			for _, kind := range order {
				r, err := b.timedStart(kind, filepath.Join(rdir, kind))
				if err != nil {
					return nil, err
				}
				r.Round, r.Warm = round, warm
				res.Runs = append(res.Runs, r)
				state := "fresh"
				if warm {
					state = "warm"
				}
				if kind == "k3sm" {
					progress("round %d/%d %-5s %-5s /readyz %s, all healthy %s (kine %s, apiserver spawned %s)",
						round, b.opts.rounds, kind, state, ms(r.Readyz), ms(r.AllUp), ms(r.Kine), ms(r.APISpawn))
				} else {
					progress("round %d/%d %-5s %-5s /readyz %s (kine served after %s, not counted)",
						round, b.opts.rounds, kind, state, ms(r.Readyz), ms(r.FloorKine))
				}
			}
		}
	}

	progress("memory: k3sm server on a fresh data dir, idle %s after it is up", b.opts.idle)
	mdir := filepath.Join(b.work, "mem")
	if err := os.MkdirAll(mdir, 0o700); err != nil {
		return nil, err
	}
	r, k, err = b.startK3sm(filepath.Join(mdir, "k3sm"))
	if err != nil {
		return nil, err
	}
	res.K3smMemUp = r
	time.Sleep(b.opts.idle)
	res.K3smMem, err = measureMemory(k)
	if err == nil {
		res.OtherUsers = sameFileMappers(b.bin, k.pids())
	}
	if serr := b.stopInstance(k); err == nil {
		err = serr
	}
	if err != nil {
		return nil, err
	}
	if b.opts.floorMem {
		progress("memory: floor (kine + kube-apiserver) on a fresh datastore, idle %s after /readyz", b.opts.idle)
		fdir := filepath.Join(mdir, "floor")
		if err := b.prepareFloorDir(fdir); err != nil {
			return nil, err
		}
		_, f, err := b.startFloor(fdir)
		if err != nil {
			return nil, err
		}
		time.Sleep(b.opts.idle)
		res.FloorMem, err = measureMemory(f)
		if serr := b.stopInstance(f); err == nil {
			err = serr
		}
		if err != nil {
			return nil, err
		}
	}
	return res, nil
}

// timedStart starts kind ("k3sm" or "floor") on dir, records its timings
// and stops it again.
func (b *bench) timedStart(kind, dir string) (*run, error) {
	var r *run
	var inst instance
	var err error
	if kind == "k3sm" {
		r, inst, err = b.startK3smInstance(dir)
	} else {
		r, inst, err = b.startFloorInstance(dir)
	}
	if err != nil {
		return nil, err
	}
	if err := b.stopInstance(inst); err != nil {
		return nil, fmt.Errorf("stopping %s on %s: %w", kind, dir, err)
	}
	return r, nil
}

func (b *bench) startK3smInstance(dir string) (*run, instance, error) {
	r, k, err := b.startK3sm(dir)
	if err != nil {
		return nil, nil, err
	}
	return r, k, nil
}

func (b *bench) startFloorInstance(dir string) (*run, instance, error) {
	r, f, err := b.startFloor(dir)
	if err != nil {
		return nil, nil, err
	}
	return r, f, nil
}

// captureFloorArgs reads the kine and kube-apiserver command lines of the
// running template server from /proc.
func (b *bench) captureFloorArgs(k *k3smServer) error {
	pids := k.pids()
	get := func(r string) ([]string, error) {
		pid := findRole(pids, r)
		if pid == 0 {
			return nil, fmt.Errorf("template server has no %s child (processes %v)", r, pids)
		}
		args, err := cmdline(pid)
		if err != nil {
			return nil, err
		}
		if args[0] != b.bin {
			return nil, fmt.Errorf("%s child runs %s, expected %s", r, args[0], b.bin)
		}
		return args[1:], nil
	}
	var err error
	if b.fa.api, err = get("kube-apiserver"); err != nil {
		return err
	}
	// Since issue 17 kine runs in the apiserver's process; the floor runs
	// the two apart, as upstream does, from the same kine config.
	if path, upstream := roleconfig.SplitKine(b.fa.api[1:]); path != "" {
		b.fa.kine = []string{roleconfig.Kine, "--config=" + path}
		b.fa.api = append([]string{b.fa.api[0]}, upstream...)
	} else if b.fa.kine, err = get("kine"); err != nil {
		return err
	}
	b.fa.templateDir, b.fa.apiPort = k.dir, k.port
	if !strings.Contains(strings.Join(b.fa.kine, " "), k.dir) {
		return fmt.Errorf("kine command line does not name the data dir %s: %q", k.dir, b.fa.kine)
	}
	if !strings.Contains(strings.Join(b.fa.api, " "), fmt.Sprintf("--secure-port=%d", k.port)) {
		return fmt.Errorf("kube-apiserver command line has no --secure-port=%d: %q", k.port, b.fa.api)
	}
	return nil
}

func measureMemory(i instance) ([]memory, error) {
	var out []memory
	for _, pid := range i.pids() {
		m, err := smapsRollup(pid)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no process to measure")
	}
	return out, nil
}

func fileExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}
