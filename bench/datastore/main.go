// Command datastore measures the same API load on each datastore k3sm
// runs on, side by side in one run: the embedded SQLite, and (through
// --datastore-endpoint) Debian's PostgreSQL and MariaDB and an etcd of one
// member built from go.mod's version, and the server's own embedded etcd
// member (--cluster-init). Each round starts every engine
// (durable: fsync on, as users run them) and a fresh `k3sm server` on it,
// then: N ConfigMap creates from P workers (latency of each, throughput),
// a watch opened before them that must see all N (how long after the last
// create it has), and a list of the N. Medians over the rounds are
// reported; with -results the report replaces its section of that file.
// It is a benchmark, not a test: nothing here asserts a figure.
//
//	go run ./bench/datastore -bin bin/k3sm -rounds 3 -results bench/RESULTS.md
//
// It only talks to 127.0.0.1 and only starts, and stops, processes of its
// own (run it in a network namespace of its own as root: bench/run.sh does).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/k3sm-dev/k3sm/bench/internal/resultsfile"
	"github.com/k3sm-dev/k3sm/internal/testutil/dbtest"
)

type options struct {
	bin               string
	engines           []string
	rounds            int
	objects, parallel int
	results           string
	invocation        string
	keep              bool
}

// result is one engine's figures in one round.
type result struct {
	engine               string
	start                time.Duration // `k3sm server` to "k3sm is up"
	createP50, createP99 time.Duration
	createsPerSec        float64
	watchLag             time.Duration // last create acknowledged -> the watch has seen all
	watchRestarts        int           // error events after which the watch was opened again
	list                 time.Duration // one list of all the objects
}

func main() {
	var o options
	defBin := os.Getenv("K3SM_BIN")
	if defBin == "" {
		defBin = "bin/k3sm"
	}
	engines := "sqlite,postgres,mariadb,etcd,etcd-embedded"
	flag.StringVar(&o.bin, "bin", defBin, "k3sm binary (default $K3SM_BIN or bin/k3sm)")
	flag.StringVar(&engines, "engines", engines, "datastores to measure, comma-separated")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; each measures every engine once, in turn")
	flag.IntVar(&o.objects, "objects", 2000, "ConfigMaps created per engine and round")
	flag.IntVar(&o.parallel, "parallel", 8, "workers creating them")
	flag.StringVar(&o.results, "results", "", "Markdown file whose datastore section is replaced by the report (empty: print only)")
	flag.StringVar(&o.invocation, "invocation", "go run ./bench/datastore "+strings.Join(os.Args[1:], " "), "the command, for the report")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.Parse()
	o.engines = strings.Split(engines, ",")
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		fatalf("%v", err)
	}
	o.bin = bin
	work, err := os.MkdirTemp("", "k3sm-bench-ds-")
	if err != nil {
		fatalf("%v", err)
	}
	if !o.keep {
		defer os.RemoveAll(work)
	}
	// PostgreSQL runs as its own account, which must reach its directory.
	if err := os.Chmod(work, 0o755); err != nil {
		fatalf("%v", err)
	}
	var etcdBin string
	if slices.Contains(o.engines, "etcd") {
		root, err := moduleRoot()
		if err != nil {
			fatalf("%v", err)
		}
		fmt.Fprintln(os.Stderr, "building etcd from go.mod's version ...")
		if etcdBin, err = dbtest.BuildEtcd(root, work); err != nil {
			fatalf("%v", err)
		}
	}
	var all []result
	for r := 1; r <= o.rounds; r++ {
		for _, e := range o.engines {
			fmt.Fprintf(os.Stderr, "round %d/%d: %s ...\n", r, o.rounds, e)
			res, err := measure(o, e, filepath.Join(work, fmt.Sprintf("%s-%d", e, r)), etcdBin)
			if err != nil {
				fatalf("%s, round %d: %v", e, r, err)
			}
			fmt.Fprintf(os.Stderr, "  %.0f creates/s, p50 %s, p99 %s, watch +%s, list %s\n",
				res.createsPerSec, ms(res.createP50), ms(res.createP99), ms(res.watchLag), ms(res.list))
			all = append(all, res)
		}
	}
	report := render(o, all)
	fmt.Print(report)
	if o.results != "" {
		if err := resultsfile.WriteSection(o.results, beginMark, endMark, report); err != nil {
			fatalf("writing %s: %v", o.results, err)
		}
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench/datastore: "+format+"\n", args...)
	os.Exit(1)
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// freePort is a loopback port below the ephemeral range that no one
// listens on.
func freePort(given map[int]bool) int {
	for {
		p := 20000 + rand.IntN(10000)
		if given[p] {
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
			l.Close()
			given[p] = true
			return p
		}
	}
}

func measure(o options, engine, dir, etcdBin string) (result, error) {
	res := result{engine: engine}
	ports := map[int]bool{}
	var flags []string
	if engine == "etcd-embedded" {
		// The server's own member (--cluster-init), durable as etcd always is.
		flags = []string{"--cluster-init", "--etcd-client-port", strconv.Itoa(freePort(ports)), "--etcd-peer-port", strconv.Itoa(freePort(ports))}
	} else if engine != "sqlite" {
		dbo := dbtest.Options{Dir: filepath.Join(dir, "db"), Port: freePort(ports), PeerPort: freePort(ports), Durable: true}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return res, err
		}
		var db *dbtest.DB
		var err error
		switch engine {
		case "postgres":
			db, err = dbtest.Postgres(dbo)
		case "mariadb":
			db, err = dbtest.MariaDB(dbo)
		case "etcd":
			db, err = dbtest.Etcd(etcdBin, dbo)
		default:
			return res, fmt.Errorf("unknown engine %q (sqlite, postgres, mariadb, etcd, etcd-embedded)", engine)
		}
		if err != nil {
			return res, err
		}
		defer db.Stop()
		flags = append([]string{"--datastore-endpoint=" + db.Endpoint}, db.Flags...)
	}
	dataDir := filepath.Join(dir, "k3sm")
	args := append([]string{"server", "--data-dir", dataDir, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--https-listen-port", strconv.Itoa(freePort(ports)), "--scheduler-port", strconv.Itoa(freePort(ports)),
		"--controller-manager-port", strconv.Itoa(freePort(ports)), "--kubelet-port", strconv.Itoa(freePort(ports)),
		"--pod-network", "host", "--node-name", "bench"}, flags...)
	var out bytes.Buffer
	var outMu sync.Mutex
	cmd := exec.Command(o.bin, args...)
	w := lockedWriter{&out, &outMu}
	cmd.Stdout, cmd.Stderr = w, w
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return res, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
		}
	}()
	for {
		outMu.Lock()
		up := strings.Contains(out.String(), "k3sm is up")
		outMu.Unlock()
		if up {
			break
		}
		select {
		case err := <-done:
			done <- err
			return res, fmt.Errorf("k3sm server exited (%v):\n%s", err, out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Since(started) > 4*time.Minute {
			return res, errors.New("k3sm server not up after 4m")
		}
	}
	res.start = time.Since(started)
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dataDir, "admin.kubeconfig"))
	if err != nil {
		return res, err
	}
	rc.QPS, rc.Burst = -1, 0 // no client-side rate limit: the datastore is measured
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return res, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{}); err != nil {
		return res, err
	}
	// As a client's reflector does: list, watch from the list's revision,
	// and after an error event (a 504 "too large resource version" while
	// the apiserver's cache catches up with the datastore) list and watch
	// again. Counted: the objects seen, by the lists or as ADDED.
	seenAll := make(chan time.Time, 1)
	firstWatch := make(chan error, 1)
	var (
		seenMu   sync.Mutex
		seen     = map[string]bool{}
		restarts int
		lastErr  string
	)
	sel := metav1.ListOptions{LabelSelector: "bench=datastore"}
	go func() {
		first := true
		for ctx.Err() == nil {
			list, err := c.CoreV1().ConfigMaps("bench").List(ctx, sel)
			var wch watch.Interface
			if err == nil {
				seenMu.Lock()
				for _, cm := range list.Items {
					seen[cm.Name] = true
				}
				seenMu.Unlock()
				wo := sel
				wo.ResourceVersion = list.ResourceVersion
				wch, err = c.CoreV1().ConfigMaps("bench").Watch(ctx, wo)
			}
			if first {
				firstWatch <- err
				first = false
			}
			if err != nil {
				seenMu.Lock()
				restarts, lastErr = restarts+1, err.Error()
				seenMu.Unlock()
				time.Sleep(time.Second)
				continue
			}
			for ev := range wch.ResultChan() {
				seenMu.Lock()
				if cm, ok := ev.Object.(*corev1.ConfigMap); ok && ev.Type == watch.Added {
					seen[cm.Name] = true
				} else if ev.Type == watch.Error {
					restarts, lastErr = restarts+1, fmt.Sprintf("%v", ev.Object)
				}
				n := len(seen)
				seenMu.Unlock()
				if n == o.objects {
					wch.Stop()
					seenAll <- time.Now()
					return
				}
			}
			wch.Stop()
		}
	}()
	if err := <-firstWatch; err != nil {
		return res, fmt.Errorf("the first watch: %w", err)
	}
	lat := make([]time.Duration, o.objects)
	var next int
	var nextMu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	payload := strings.Repeat("x", 512)
	t0 := time.Now()
	for range o.parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				nextMu.Lock()
				i := next
				next++
				nextMu.Unlock()
				if i >= o.objects {
					return
				}
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%05d", i), Labels: map[string]string{"bench": "datastore"}},
					Data: map[string]string{"payload": payload}}
				s := time.Now()
				_, err := c.CoreV1().ConfigMaps("bench").Create(ctx, cm, metav1.CreateOptions{})
				lat[i] = time.Since(s)
				if err != nil {
					nextMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					nextMu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	lastAck := time.Now()
	if firstErr != nil {
		return res, fmt.Errorf("create: %w", firstErr)
	}
	res.createsPerSec = float64(o.objects) / lastAck.Sub(t0).Seconds()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	res.createP50, res.createP99 = lat[len(lat)/2], lat[len(lat)*99/100]
	select {
	case at := <-seenAll:
		res.watchLag = max(0, at.Sub(lastAck))
		seenMu.Lock()
		res.watchRestarts = restarts
		if restarts > 0 {
			fmt.Fprintf(os.Stderr, "  the watch was opened again %d times; the last error: %s\n", restarts, lastErr)
		}
		seenMu.Unlock()
	case <-time.After(2 * time.Minute):
		seenMu.Lock()
		defer seenMu.Unlock()
		return res, fmt.Errorf("the watch saw %d of the %d creates within 2m (opened again %d times; the last error: %s)", len(seen), o.objects, restarts, lastErr)
	}
	s := time.Now()
	list, err := c.CoreV1().ConfigMaps("bench").List(ctx, metav1.ListOptions{LabelSelector: "bench=datastore"})
	if err != nil {
		return res, err
	}
	res.list = time.Since(s)
	if len(list.Items) != o.objects {
		return res, fmt.Errorf("listed %d ConfigMaps, created %d", len(list.Items), o.objects)
	}
	return res, nil
}

type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func median[T int64 | float64](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// Markers around the generated section (resultsfile.WriteSection).
const (
	beginMark = "<!-- bench/datastore: begin (generated by `bench/run.sh datastore`; edits inside are overwritten) -->"
	endMark   = "<!-- bench/datastore: end -->"
)

func render(o options, all []result) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "## Datastores (issue 32)\n\n")
	fmt.Fprintf(&b, "Measured by `bench/datastore` on %s (%s, %d CPUs, load average %s at the end), %s.\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), host, runtime.NumCPU(), loadavg(), commit())
	fmt.Fprintf(&b, "Reproduce with `%s`. Every engine on 127.0.0.1 of one network namespace, durable (fsync on);\n", o.invocation)
	fmt.Fprintf(&b, "a fresh `k3sm server` (`--pod-network host`) on each. Load: %d ConfigMaps of 512 bytes created by %d workers\n", o.objects, o.parallel)
	fmt.Fprintf(&b, "(no client-side rate limit), a watch opened before them (listed and opened again after an error event, as a\n")
	fmt.Fprintf(&b, "reflector does; the count is the sum over the rounds), then one list of all. Medians of %d rounds,\n", o.rounds)
	fmt.Fprintf(&b, "the engines taking turns within each round. etcd is one external member; etcd-embedded the server's own (`--cluster-init`).\n")
	fmt.Fprintf(&b, "The list is served from the apiserver's watch cache (consistent reads from cache), so it says little of the datastore.\n\n")
	fmt.Fprintf(&b, "| datastore | server up | creates/s | create p50 | create p99 | watch saw all, after the last create | watch opened again | list of %d | creates/s vs SQLite |\n", o.objects)
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|\n")
	var base float64
	for _, e := range o.engines {
		var up, p50, p99, lag, list []int64
		var rate []float64
		restarts := 0
		for _, r := range all {
			if r.engine != e {
				continue
			}
			restarts += r.watchRestarts
			up, p50, p99, lag, list = append(up, int64(r.start)), append(p50, int64(r.createP50)), append(p99, int64(r.createP99)),
				append(lag, int64(r.watchLag)), append(list, int64(r.list))
			rate = append(rate, r.createsPerSec)
		}
		if len(rate) == 0 {
			continue
		}
		mr := median(rate)
		if e == "sqlite" {
			base = mr
		}
		ratio := "-"
		if base > 0 {
			ratio = fmt.Sprintf("%.2f×", mr/base)
		}
		fmt.Fprintf(&b, "| %s | %.1f s | %.0f | %s | %s | %s | %d | %s | %s |\n", e, time.Duration(median(up)).Seconds(), mr,
			ms(time.Duration(median(p50))), ms(time.Duration(median(p99))), ms(time.Duration(median(lag))), restarts, ms(time.Duration(median(list))), ratio)
	}
	b.WriteString("\n")
	return b.String()
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "commit unknown"
	}
	return "commit " + strings.TrimSpace(string(out))
}
