//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/k3sm-dev/k3sm/internal/testutil/dbtest"
)

const (
	// The benchmark's own network: the bridge (and PostgreSQL) on .1, the
	// servers on .2, .3, .4, each in a network namespace of its own.
	subnet = "192.168.80"
	hostIP = subnet + ".1"
	prefix = "/24"
	bridge = "kbfobr"
	// Every server's ports, the same in each namespace: the apiservers'
	// endpoint reconciler publishes one port for all of them.
	apiPort        = 6443
	schedulerPort  = 10259
	cmPort         = 10257
	kubeletPort    = 10250
	supervisorPort = 9345
	meshPort       = 51820
	dbPort         = 5432
	servers        = 3
	serverUp       = "k3sm is up"
	upTimeout      = 4 * time.Minute
	// ns is the namespace the writer's ConfigMaps go to.
	ns = "bench-failover"
	// hostPrefix is each server's hostname (its UTS namespace's) before
	// its number: the controllers' lease identities start with it.
	hostPrefix = "failover-"
)

// bench is one run: what it started and made, for cleanup.
type bench struct {
	work, bin string
	id        int // this process's pid: names the namespaces
	db        *dbtest.DB
	srv       []*server
	token     string
	admin     *rest.Config // server 0's admin credentials, its Host to be set
	links     []string     // in this namespace
	netns     []string
	acked     map[string]bool // every acknowledged ConfigMap, over all rounds
	next      atomic.Int64    // the writers' name counter, over all rounds
}

// server is one `k3sm server` in its namespace.
type server struct {
	i                     int
	netns, ip, host, data string
	args                  []string
	p                     *proc
	starts                int
}

func (s *server) addr() string { return net.JoinHostPort(s.ip, strconv.Itoa(apiPort)) }

func (s *server) running() bool { return s.p != nil && s.p.exited() == nil }

// ownNetns refuses to run in the machine's network namespace or in one
// that has more than a loopback: the benchmark makes a bridge and
// namespaces, and its servers listen on 0.0.0.0.
func ownNetns() error {
	// Where pid 1's namespace can be read (not in every sandbox), it must
	// not be this one; either way, one holding only lo is one of ours.
	self, err1 := os.Readlink("/proc/self/ns/net")
	initNS, err2 := os.Readlink("/proc/1/ns/net")
	if err1 == nil && err2 == nil && self == initNS {
		return errors.New("not in a network namespace of its own: run it through `bench/run.sh failover` (unshare --net)")
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, i := range ifs {
		if i.Name != "lo" {
			return fmt.Errorf("this network namespace has %s: run it in a fresh one (`bench/run.sh failover` does: unshare --net)", i.Name)
		}
	}
	return ip("link", "set", "lo", "up")
}

func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setup makes the network, starts PostgreSQL and the three servers (the
// first makes the cluster, the others join with its token), and waits
// until the kubernetes Service lists all three.
func (b *bench) setup(ctx context.Context) error {
	b.acked = map[string]bool{}
	if err := b.makeNet(); err != nil {
		return err
	}
	var err error
	b.db, err = dbtest.Postgres(dbtest.Options{Dir: filepath.Join(b.work, "db"), Port: dbPort, Host: hostIP, Durable: true})
	if err != nil {
		return fmt.Errorf("PostgreSQL: %w", err)
	}
	logf("PostgreSQL on %s:%d", hostIP, dbPort)
	for i, s := range b.srv {
		s.args = []string{"server", "--data-dir", s.data,
			"--https-listen-port", strconv.Itoa(apiPort),
			"--scheduler-port", strconv.Itoa(schedulerPort),
			"--controller-manager-port", strconv.Itoa(cmPort),
			"--kubelet-port", strconv.Itoa(kubeletPort),
			"--supervisor-port", strconv.Itoa(supervisorPort),
			"--mesh-port", strconv.Itoa(meshPort),
			"--node-name", s.host, "--bind-address", "0.0.0.0", "--advertise-address", s.ip,
			"--datastore-endpoint=" + b.db.Endpoint, "--disable-agent"}
		if i > 0 {
			s.args = append(s.args, "--token", b.token)
		}
		d, err := b.start(ctx, s)
		if err != nil {
			return err
		}
		logf("server %d (%s) up in %s", i, s.ip, d.Round(time.Millisecond))
		if i == 0 {
			if b.token, err = b.createToken(ctx, s); err != nil {
				return err
			}
			if b.admin, err = clientcmd.BuildConfigFromFlags("", filepath.Join(s.data, "admin.kubeconfig")); err != nil {
				return err
			}
			b.admin.UserAgent = "k3sm-bench-failover"
			_, err := b.direct(s).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
		}
	}
	_, err = b.waitEndpoints(ctx)
	return err
}

// makeNet makes the bridge (hostIP) and, for each server, a network
// namespace joined to it by a veth pair whose inner end is eth0.
func (b *bench) makeNet() error {
	b.links = append(b.links, bridge)
	for _, args := range [][]string{
		{"link", "add", bridge, "type", "bridge"},
		{"addr", "add", hostIP + prefix, "dev", bridge},
		{"link", "set", bridge, "up"},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	for i := range servers {
		s := &server{i: i, netns: fmt.Sprintf("k3sm-failover-%d-%d", b.id, i), ip: fmt.Sprintf("%s.%d", subnet, i+2),
			host: fmt.Sprintf("%s%d", hostPrefix, i), data: filepath.Join(b.work, fmt.Sprintf("server-%d", i))}
		b.srv = append(b.srv, s)
		host := fmt.Sprintf("kbfo%dh", i)
		if err := ip("netns", "add", s.netns); err != nil {
			return err
		}
		b.netns = append(b.netns, s.netns)
		b.links = append(b.links, host)
		for _, args := range [][]string{
			{"link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", s.netns},
			{"link", "set", host, "master", bridge},
			{"link", "set", host, "up"},
			{"-n", s.netns, "addr", "add", s.ip + prefix, "dev", "eth0"},
			{"-n", s.netns, "link", "set", "eth0", "up"},
			{"-n", s.netns, "link", "set", "lo", "up"},
		} {
			if err := ip(args...); err != nil {
				return err
			}
		}
	}
	return nil
}

// start runs s (again, from its data dir) in its network namespace and a
// UTS namespace of its own named s.host, and waits until it is up. The
// wrappers exec, so the process started is the server itself.
func (b *bench) start(ctx context.Context, s *server) (time.Duration, error) {
	if err := waitGone(ctx, s.data); err != nil {
		return 0, err
	}
	s.starts++
	argv := append([]string{"ip", "netns", "exec", s.netns, "unshare", "--uts", "--",
		"sh", "-c", `hostname "$1" && shift && exec "$@"`, "sh", s.host, b.bin}, s.args...)
	p, err := startProc(fmt.Sprintf("server %d", s.i), filepath.Join(b.work, fmt.Sprintf("server-%d.%d.log", s.i, s.starts)), serverUp, argv...)
	if err != nil {
		return 0, err
	}
	s.p = p
	deadline := time.After(upTimeout)
	for {
		select {
		case <-p.up:
			d := p.upAt.Sub(p.started)
			if d > slowStart {
				logf("server %d took %s to start; the longest silence in its output, %s, came after\n\t%s\nand ended with\n\t%s",
					s.i, d.Round(time.Millisecond), p.silence.Round(time.Millisecond), p.before, p.resumed)
			}
			return d, nil
		case <-p.done:
			return 0, p.exited()
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-deadline:
			return 0, fmt.Errorf("server %d not up after %s; log %s:\n%s", s.i, upTimeout, p.logPath, p.tail())
		}
	}
}

// createToken runs `k3sm token create` in s's namespace (it reaches the
// server's loopback API); its last line is the token.
func (b *bench) createToken(ctx context.Context, s *server) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", s.netns, b.bin, "token", "create", "--data-dir", s.data, "--description", "bench/failover")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("k3sm token create: %v: %s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	tok := strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(tok, "K10") {
		return "", fmt.Errorf("k3sm token create printed %q, not a token", out)
	}
	return tok, nil
}

// config is the admin credentials for host (https://...), with a 5 s
// request timeout and no client-side rate limit.
func (b *bench) config(host string) *rest.Config {
	rc := rest.CopyConfig(b.admin)
	rc.Host = host
	rc.Timeout = 5 * time.Second
	rc.QPS, rc.Burst = -1, 0
	return rc
}

// answeredBy is the context key of an *int the traced transport sets to
// the server that answered the request.
type answeredBy struct{}

// traced is config(host) with a transport that tells which server
// answered each request (through answeredBy): the one whose advertise
// address is in the serving certificate the connection presented.
func (b *bench) traced(host string) *rest.Config {
	rc := b.config(host)
	ips := map[string]int{}
	for _, s := range b.srv {
		ips[s.ip] = s.i
	}
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if p, ok := req.Context().Value(answeredBy{}).(*int); ok && resp != nil && resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
				for _, a := range resp.TLS.PeerCertificates[0].IPAddresses {
					if i, ok := ips[a.String()]; ok {
						*p = i
					}
				}
			}
			return resp, err
		})
	}
	return rc
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// direct is a client of s's apiserver alone (the serving certificate
// holds the advertise address).
func (b *bench) direct(s *server) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(b.config("https://" + s.addr()))
}

// anyRunning is a client of a running server other than not (-1: any).
func (b *bench) anyRunning(not int) (kubernetes.Interface, error) {
	for _, s := range b.srv {
		if s.i != not && s.running() {
			return b.direct(s), nil
		}
	}
	return nil, errors.New("no server runs")
}

// waitEndpoints waits until the kubernetes Service's EndpointSlices list
// all three servers as ready, and returns how long that took.
func (b *bench) waitEndpoints(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	var want []string
	for _, s := range b.srv {
		want = append(want, s.ip)
	}
	var got []string
	var err error
	for time.Since(start) < 2*time.Minute {
		var c kubernetes.Interface
		if c, err = b.anyRunning(-1); err == nil {
			if got, err = apiEndpoints(ctx, c); err == nil && slices.Equal(got, want) {
				return time.Since(start), nil
			}
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("the kubernetes Service's endpoints are %v (%v) after 2m, want %v", got, err, want)
}

// apiEndpoints are the ready addresses of the kubernetes Service, sorted.
func apiEndpoints(ctx context.Context, c kubernetes.Interface) ([]string, error) {
	sls, err := c.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil {
		return nil, err
	}
	var ips []string
	for _, sl := range sls.Items {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				ips = append(ips, ep.Addresses...)
			}
		}
	}
	sort.Strings(ips)
	return ips, nil
}

// killTree sends SIGKILL to pid and every process descended from it, at
// once (the tree is read first, then every process is sent its signal),
// and returns how many processes it signalled.
func killTree(pid int) int {
	n := 0
	for _, p := range tree(pid) {
		if syscall.Kill(p, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// tree is pid and the processes descended from it.
func tree(pid int) []int {
	pids := []int{pid}
	for i := 0; i < len(pids); i++ {
		// A Go process forks from any of its threads: each lists its own.
		files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pids[i]))
		for _, f := range files {
			data, _ := os.ReadFile(f)
			for _, w := range strings.Fields(string(data)) {
				if c, err := strconv.Atoi(w); err == nil && !slices.Contains(pids, c) {
					pids = append(pids, c)
				}
			}
		}
	}
	return pids
}

// machineProcs are the processes of server s's machine: the server's
// tree and every process in its network namespace.
func machineProcs(s *server) []int {
	pids := tree(s.p.pid())
	for _, pid := range netnsProcs(s.netns) {
		if !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// netnsProcs are the live processes in network namespace name (ip netns).
func netnsProcs(name string) []int {
	want, err := os.Stat(filepath.Join("/run/netns", name))
	if err != nil {
		return nil
	}
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || zombie(pid) {
			continue
		}
		if st, err := os.Stat(filepath.Join("/proc", e.Name(), "ns", "net")); err == nil && os.SameFile(st, want) {
			out = append(out, pid)
		}
	}
	return out
}

func zombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || strings.HasPrefix(strings.TrimSpace(string(stat[i+1:])), "Z")
}

// waitNetnsEmpty waits until no process is left in network namespace
// name (a killed process may take a while to exit: its memory is freed
// before its sockets are closed), SIGKILLing any found, and returns when
// it found none.
func waitNetnsEmpty(ctx context.Context, name string) (time.Time, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := netnsProcs(name)
		now := time.Now()
		if len(left) == 0 {
			return now, nil
		}
		if now.After(deadline) {
			return now, fmt.Errorf("processes %v still run in network namespace %s 30s after they were killed", left, name)
		}
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return now, err
		}
	}
}

// leftovers are the live processes that run from dir, name it on their
// command line or work in it.
func leftovers(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err != nil ||
			strings.HasPrefix(strings.TrimSpace(string(stat[strings.LastIndexByte(string(stat), ')')+1:])), "Z") {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.HasPrefix(exe, dir+"/") || strings.Contains(string(cmdline), dir+"/") || cwd == dir || strings.HasPrefix(cwd, dir+"/") {
			out = append(out, pid)
		}
	}
	return out
}

// killLeftovers SIGKILLs leftovers(dir) and returns how many there were.
func killLeftovers(dir string) int {
	n := 0
	for _, pid := range leftovers(dir) {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// waitGone waits until no process of data dir dir is left (a killed
// server's children are reaped by init), killing any that remain.
func waitGone(ctx context.Context, dir string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := leftovers(dir)
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of %s still run 30s after they were killed", left, dir)
		}
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// cleanup stops the servers and PostgreSQL, kills whatever of theirs is
// left, and removes the namespaces, links and files the run made.
func (b *bench) cleanup() error {
	var errs []error
	var wg sync.WaitGroup
	for _, s := range b.srv {
		wg.Go(func() {
			if err := s.p.stop(); err != nil {
				logf("%v", err)
			}
		})
	}
	wg.Wait()
	for _, s := range b.srv {
		if n := killLeftovers(s.data); n > 0 {
			logf("killed %d processes left of server %d", n, s.i)
		}
	}
	if b.db != nil {
		b.db.Stop()
	}
	if n := killLeftovers(b.work); n > 0 {
		logf("killed %d processes left under %s", n, b.work)
	}
	for _, s := range b.srv {
		_ = waitGone(context.Background(), s.data)
	}
	for _, ns := range b.netns {
		errs = append(errs, ip("netns", "del", ns))
	}
	for i := len(b.links) - 1; i >= 0; i-- {
		_ = ip("link", "del", b.links[i]) // the veths are gone with their namespaces
	}
	errs = append(errs, os.RemoveAll(b.work))
	return errors.Join(errs...)
}

// proc is a process the benchmark started, its output (stdout and
// stderr) written to logPath and watched for one marker line.
type proc struct {
	name, logPath string
	cmd           *exec.Cmd
	started       time.Time // just before it was executed
	done          chan struct{}
	err           error // its exit, once done is closed
	up            chan struct{}
	upAt          time.Time // when marker was seen; set before up is closed
	// The longest silence in its output before marker: read after up.
	silence         time.Duration
	before, resumed string
}

func startProc(name, logPath, marker string, argv ...string) (*proc, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	p := &proc{name: name, logPath: logPath, cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{}), up: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	p.started = time.Now()
	err = p.cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		logFile.Close()
		return nil, err
	}
	go func() {
		defer logFile.Close()
		defer r.Close()
		seen := false
		last, lastLine := p.started, "(started)"
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			now, line := time.Now(), sc.Text()
			_, _ = logFile.WriteString(line + "\n")
			if seen {
				continue
			}
			if d := now.Sub(last); d > p.silence {
				p.silence, p.before, p.resumed = d, lastLine, line
			}
			last, lastLine = now, line
			if strings.Contains(line, marker) {
				seen, p.upAt = true, now
				close(p.up)
			}
		}
		// After a line too long to scan: keep the writers from blocking.
		_, _ = io.Copy(logFile, r)
	}()
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.logPath)
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(l[max(0, len(l)-30):], "\n")
}

// exited returns an error if the process has exited.
func (p *proc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); log %s:\n%s", p.name, p.err, p.logPath, p.tail())
	default:
		return nil
	}
}

// stop sends SIGTERM and waits up to a minute, then SIGKILLs its tree.
func (p *proc) stop() error {
	if p == nil || p.exited() != nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(time.Minute):
		killTree(p.pid())
		<-p.done
		return fmt.Errorf("%s did not stop within 1m of SIGTERM; killed", p.name)
	}
}
