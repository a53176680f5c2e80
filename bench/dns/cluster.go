//go:build linux

package main

// The -cluster mode: k3sm's resolver and CoreDNS side by side, both reading
// one real cluster.
//
// The program runs itself again under `unshare --net --mount` (as
// bench/podnet does): the inner process brings lo up in its fresh network
// namespace and starts `k3sm server --pod-network=host` there on a data dir
// in a temp dir, bound to 127.0.0.1 on free ports. (In host mode the node
// serves no cluster DNS of its own, so nothing but the two measured servers
// answers.) It creates -services Services through the API, a tenth
// headless with an EndpointSlice of three ready endpoints, the rest with a
// ClusterIP the apiserver assigns. Then it starts, each with GOMAXPROCS=1
// (and under taskset -c <cpu> with -cpu):
//
//   - k3sm's resolver (internal/agent/dns) in a child, this program's
//     -serve mode with the admin kubeconfig, on 127.0.0.77;
//   - CoreDNS built from its Go module (bench/coredns), on 127.0.0.78,
//     with `bind`, `errors`, [`cache`,] and `kubernetes cluster.local`
//     reading the same apiserver through the same admin kubeconfig.
//
// Once both answer -name with the Service's ClusterIP, the same load
// generator loads each in turn: a warm-up each, then -rounds rounds,
// alternating which goes first. The outer process removes the temp dir
// however the inner one ends (unless -keep).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// innerEnv, set by the outer process, holds the temp dir the inner one
// (already in its own network and mount namespaces) works in; outerNSEnv
// identifies the network namespace the outer one ran in.
const (
	innerEnv   = "K3SM_BENCH_DNS_DIR"
	outerNSEnv = "K3SM_BENCH_DNS_OUTER_NETNS"
)

const (
	k3smIP    = "127.0.0.77" // k3sm's resolver
	corednsIP = "127.0.0.78" // CoreDNS
)

// cluster runs the -cluster mode and returns the exit code.
func cluster(o options) int {
	if dir := os.Getenv(innerEnv); dir != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		if err := clusterInner(ctx, dir, o); err != nil {
			fmt.Fprintln(os.Stderr, "bench/dns -cluster:", err)
			return 1
		}
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/dns -cluster: skipped: needs root (it runs `k3sm server` in a network namespace of its own)")
		return 0
	}
	for _, p := range []*string{&o.k3smBin, &o.coredns} {
		abs, err := filepath.Abs(*p)
		if err == nil {
			_, err = exec.LookPath(abs)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench/dns -cluster: %v (build k3sm with `make bin/k3sm`, CoreDNS with `cd bench/coredns && go build -o ../../_output/bench/coredns .`)\n", err)
			return 1
		}
		*p = abs
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/dns -cluster: needs unshare(1) from util-linux:", err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/dns -cluster:", err)
		return 1
	}
	outerNS, err := nsID("/proc/self/ns/net")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/dns -cluster:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "k3sm-bench-dns-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/dns -cluster:", err)
		return 1
	}
	// The inner process gets the binaries as absolute paths: flags given
	// later on the command line win over earlier ones.
	args := append([]string{"--net", "--mount", "--propagation", "private", "--", self}, os.Args[1:]...)
	args = append(args, "-k3sm-bin", o.k3smBin, "-coredns", o.coredns)
	cmd := exec.Command(unshare, args...)
	cmd.Env = append(os.Environ(), innerEnv+"="+dir, outerNSEnv+"="+outerNS)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "bench/dns -cluster:", err)
		os.RemoveAll(dir)
		return 1
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	code := 0
	if err := cmd.Wait(); err != nil {
		code = 1
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			code = ee.ExitCode()
		} else {
			fmt.Fprintln(os.Stderr, "bench/dns -cluster:", err)
		}
	}
	if o.keep || code != 0 {
		fmt.Fprintf(os.Stderr, "bench/dns -cluster: work dir (server data dir and log, Corefile, CoreDNS log) kept in %s\n", dir)
	} else {
		os.RemoveAll(dir)
	}
	return code
}

// measured is one of the two servers under load.
type measured struct {
	label  string
	addr   string
	pid    int
	rounds []round
	rss    int64 // kB, after the rounds
	pss    int64
}

func clusterInner(ctx context.Context, dir string, o options) error {
	if err := checkIsolated(); err != nil {
		return err
	}
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	load0 := readFile("/proc/loadavg")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	srv, err := startK3smServer(ctx, dir, o)
	if err != nil {
		return err
	}
	defer srv.stop()
	fmt.Printf("bench/dns: k3sm server up (pid %d, %s), apiserver on %s\n", srv.pid, srv.version, srv.host)

	t0 := time.Now()
	want, err := createServices(ctx, srv.client, o)
	if err != nil {
		return err
	}
	if o.want != "" && o.want != want {
		return fmt.Errorf("-want %s, but %s has ClusterIP %s", o.want, o.name, want)
	}
	fmt.Printf("bench/dns: %d Services created in %s; %s is %s\n", o.services, time.Since(t0).Round(time.Millisecond), o.name, want)
	wantIP, packed, err := queryFor(o.name, want)
	if err != nil {
		return err
	}

	// The resolver runs from a private copy of this program, so that its PSS
	// shares no pages with the load generator.
	if o.serveBin, err = copySelf(filepath.Join(dir, "bench-dns-resolver")); err != nil {
		return err
	}
	o.ip = k3smIP
	kAddr, kPid, stopK, err := startResolver(ctx, o, "-kubeconfig", srv.kubeconfig)
	if err != nil {
		return fmt.Errorf("k3sm resolver: %w", err)
	}
	defer stopK()
	cd, err := startCoreDNS(ctx, dir, o, srv.kubeconfig)
	if err != nil {
		return err
	}
	defer cd.stop()

	servers := []*measured{
		{label: "k3sm (internal/agent/dns)", addr: kAddr, pid: kPid},
		{label: cd.version, addr: cd.addr, pid: cd.cmd.Process.Pid},
	}
	for _, s := range servers {
		if err := waitAnswer(ctx, s.addr, o.name, want, o.timeout, cd.exited); err != nil {
			return fmt.Errorf("%s at %s: %w", s.label, s.addr, err)
		}
	}
	fmt.Printf("bench/dns: both answer %s A %s; %d clients x %d in flight, %d rounds of %s each, alternating which goes first\n",
		o.name, want, o.clients, o.inflight, o.rounds, o.duration)

	for _, s := range servers {
		if o.warmup > 0 {
			if _, err := load(ctx, s.addr, packed, wantIP, o, o.warmup, 0); err != nil {
				return fmt.Errorf("%s: %w", s.label, err)
			}
		}
	}
	bg0 := treeCPU(srv.pid)
	tr0 := time.Now()
	for i := range o.rounds {
		order := []*measured{servers[0], servers[1]}
		if i%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, s := range order {
			r, err := load(ctx, s.addr, packed, wantIP, o, o.duration, s.pid)
			if err != nil {
				return fmt.Errorf("%s: %w", s.label, err)
			}
			s.rounds = append(s.rounds, r)
			fmt.Printf("round %d %s: %.0f queries/s, server CPU %.2f cores, %d lost, %d wrong\n", i+1, s.label, r.qps, r.cpu, r.lost, r.bad)
		}
	}
	bgCPU := (treeCPU(srv.pid) - bg0) / time.Since(tr0).Seconds()
	for _, s := range servers {
		s.rss, s.pss = rollup(s.pid)
	}
	clusterReport(o, srv, cd, servers, bgCPU, load0, readFile("/proc/loadavg"))
	return nil
}

// copySelf copies this program's executable to dst.
func copySelf(dst string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(self)
	if err != nil {
		return "", err
	}
	return dst, os.WriteFile(dst, b, 0o755)
}

// checkIsolated refuses to run in the network namespace the outer process
// ran in (or that of pid 1, where it can be read).
func checkIsolated() error {
	self, err := nsID("/proc/self/ns/net")
	if err != nil {
		return err
	}
	outer := os.Getenv(outerNSEnv)
	if outer == "" {
		return errors.New("the outer process did not say which namespace it ran in (" + outerNSEnv + ")")
	}
	init, _ := nsID("/proc/1/ns/net") // not readable in every container
	if self == outer || self == init {
		return errors.New("refusing to run in the machine's network namespace (run the program without " + innerEnv + ")")
	}
	return nil
}

// nsID identifies a namespace by the device and inode of its file.
func nsID(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}

// k3smServer is the running cluster.
type k3smServer struct {
	pid        int
	host       string
	version    string
	kubeconfig string
	client     kubernetes.Interface
	cmd        *exec.Cmd
	exited     chan struct{}
	log        *os.File
}

func freeTCPPorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // held until all are picked, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startK3smServer starts `k3sm server --pod-network=host` on dir/data and
// waits until its apiserver is ready.
func startK3smServer(ctx context.Context, dir string, o options) (*k3smServer, error) {
	ports, err := freeTCPPorts(4)
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.k3smBin, "server", "--data-dir", data,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--https-listen-port", strconv.Itoa(ports[0]),
		"--scheduler-port", strconv.Itoa(ports[1]),
		"--controller-manager-port", strconv.Itoa(ports[2]),
		"--kubelet-port", strconv.Itoa(ports[3]),
		"--node-name", "bench", "--pod-network", "host")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	s := &k3smServer{pid: cmd.Process.Pid, host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), cmd: cmd, exited: make(chan struct{}), log: logf,
		kubeconfig: filepath.Join(data, "admin.kubeconfig")}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	if out, err := exec.Command(o.k3smBin, "version").Output(); err == nil {
		s.version, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	for {
		if s.client == nil {
			if cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig); err == nil {
				cfg.QPS, cfg.Burst = 500, 1000
				cfg.Timeout = 10 * time.Second
				if s.client, err = kubernetes.NewForConfig(cfg); err != nil {
					s.stop()
					return nil, err
				}
			}
		}
		// Up: the apiserver is ready and the server logged that all its
		// components are (so it is quiet while the resolvers are measured).
		if s.client != nil && strings.Contains(readFile(logf.Name()), "k3sm is up") {
			if b, err := s.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err == nil && string(b) == "ok" {
				return s, nil
			}
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("k3sm server exited before it was up; see %s", logf.Name())
		case <-ctx.Done():
			s.stop()
			return nil, fmt.Errorf("k3sm server not up after %s (is k3sm-shim beside %s?); see %s", o.timeout, o.k3smBin, logf.Name())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM and waits; if it has not exited after a minute, its
// process group is killed.
func (s *k3smServer) stop() {
	defer s.log.Close()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(time.Minute):
		fmt.Fprintln(os.Stderr, "bench/dns: k3sm server did not stop within 1m of SIGTERM; killing its process group")
		_ = syscall.Kill(-s.pid, syscall.SIGKILL)
		<-s.exited
	}
}

// createServices creates the fixture's Services and EndpointSlices through
// the API (the apiserver assigns the ClusterIPs) and returns the ClusterIP
// of the Service o.name names.
func createServices(ctx context.Context, cs kubernetes.Interface, o options) (string, error) {
	objs, _ := fixture(o.services)
	work := make(chan func(context.Context) error)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				var err error
				// The default namespace appears shortly after /readyz.
				for try := 0; try < 50; try++ {
					if err = f(ctx); err == nil || ctx.Err() != nil {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				if err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}
		}()
	}
	for _, obj := range objs {
		switch v := obj.(type) {
		case *corev1.Service:
			if v.Spec.ClusterIP != corev1.ClusterIPNone {
				v.Spec.ClusterIP = ""
			}
			work <- func(ctx context.Context) error {
				_, err := cs.CoreV1().Services(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
				return err
			}
		case *discoveryv1.EndpointSlice:
			work <- func(ctx context.Context) error {
				_, err := cs.DiscoveryV1().EndpointSlices(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
				return err
			}
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errc:
		return "", fmt.Errorf("create the Services: %w", err)
	default:
	}
	// <svc>.<ns>.svc.<domain>.
	parts := strings.Split(strings.TrimSuffix(strings.ToLower(dns.Fqdn(o.name)), "."), ".")
	if len(parts) < 4 || parts[2] != "svc" {
		return "", fmt.Errorf("-name %s is not <service>.<namespace>.svc.cluster.local", o.name)
	}
	svc, err := cs.CoreV1().Services(parts[1]).Get(ctx, parts[0], metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if ip := svc.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
		return ip, nil
	}
	return "", fmt.Errorf("-name %s: Service %s/%s has no ClusterIP", o.name, parts[1], parts[0])
}

// corednsServer is the running CoreDNS.
type corednsServer struct {
	addr     string
	version  string
	corefile string
	cmd      *exec.Cmd
	exited   chan struct{}
	log      *os.File
}

func (c *corednsServer) stop() {
	defer c.log.Close()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// startCoreDNS writes a Corefile that serves cluster.local from the
// kubernetes plugin on a free port of corednsIP and starts CoreDNS on it.
func startCoreDNS(ctx context.Context, dir string, o options, kubeconfig string) (*corednsServer, error) {
	pc, err := net.ListenPacket("udp", net.JoinHostPort(corednsIP, "0"))
	if err != nil {
		return nil, err
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	cache := ""
	if o.corednsCache > 0 {
		cache = fmt.Sprintf("\tcache %d\n", o.corednsCache)
	}
	corefile := fmt.Sprintf("cluster.local:%d {\n\tbind %s\n\terrors\n%s\tkubernetes cluster.local {\n\t\tkubeconfig %s\n\t\tpods insecure\n\t\tttl 5\n\t}\n}\n",
		port, corednsIP, cache, kubeconfig)
	path := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "coredns.log"))
	if err != nil {
		return nil, err
	}
	c := &corednsServer{addr: net.JoinHostPort(corednsIP, strconv.Itoa(port)), version: "CoreDNS", corefile: corefile, exited: make(chan struct{}), log: logf}
	if out, err := exec.Command(o.coredns, "-version").Output(); err == nil {
		c.version = strings.Fields(string(out) + " CoreDNS")[0]
	}
	c.cmd = pinned(ctx, o.cpu, o.coredns, "-conf", path)
	c.cmd.Dir = dir
	c.cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	if err := c.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() { _ = c.cmd.Wait(); close(c.exited) }()
	return c, nil
}

// waitAnswer asks addr for name until the answer is NOERROR with one A
// record of want.
func waitAnswer(ctx context.Context, addr, name, want string, timeout time.Duration, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := &dns.Client{Net: "udp", Timeout: time.Second}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	last := "no answer"
	for {
		if m, _, err := c.ExchangeContext(ctx, q, addr); err != nil {
			last = err.Error()
		} else if a, ok := firstA(m); m.Rcode == dns.RcodeSuccess && ok && a == want && len(m.Answer) == 1 {
			return nil
		} else {
			last = fmt.Sprintf("%s, %d answers", dns.RcodeToString[m.Rcode], len(m.Answer))
		}
		select {
		case <-exited:
			return errors.New("CoreDNS exited; see coredns.log in the work dir")
		case <-ctx.Done():
			return fmt.Errorf("no right answer for %s after %s (last: %s)", name, timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func firstA(m *dns.Msg) (string, bool) {
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			return a.A.String(), true
		}
	}
	return "", false
}

// treeCPU is the user+system time of root and every process under it
// (the children of a process that already exited are not counted).
func treeCPU(root int) float64 {
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		s := readFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			if f := strings.Fields(s[i+1:]); len(f) > 1 {
				parent[pid], _ = strconv.Atoi(f[1])
			}
		}
	}
	var sum float64
	for pid := range parent {
		for p := pid; p > 1; p = parent[p] {
			if p == root {
				sum += cpuSeconds(pid)
				break
			}
		}
	}
	return sum
}

// rollup reads RSS and PSS (kB) from /proc/<pid>/smaps_rollup.
func rollup(pid int) (rss, pss int64) {
	for _, l := range strings.Split(readFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid)), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		}
	}
	return rss, pss
}

func mib(kb int64) string {
	if kb == 0 {
		return "?"
	}
	return fmt.Sprintf("%.1f MiB", float64(kb)/1024)
}

func span(v []float64) (lo, hi float64) {
	lo, hi = v[0], v[0]
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

func clusterReport(o options, srv *k3smServer, cd *corednsServer, servers []*measured, bgCPU float64, load0, load1 string) {
	type sum struct{ qps, cpu, per float64 }
	sums := make([]sum, len(servers))
	for i, s := range servers {
		var qps, cpu, per []float64
		for _, r := range s.rounds {
			qps = append(qps, r.qps)
			cpu = append(cpu, r.cpu)
			if r.cpu > 0 {
				per = append(per, r.qps/r.cpu)
			}
		}
		sums[i] = sum{median(qps), median(cpu), 0}
		if len(per) > 0 {
			sums[i].per = median(per)
		}
	}
	pin := "not pinned"
	if o.cpu >= 0 {
		pin = fmt.Sprintf("`taskset -c %d`", o.cpu)
	}
	host, _ := os.Hostname()
	fmt.Printf("\n## Cluster DNS: k3sm's resolver and CoreDNS, one cluster\n\n")
	fmt.Printf("- Date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("- Machine: %s, %d CPUs, %s\n", host, runtime.NumCPU(), cpuModel())
	fmt.Printf("- Command: `%s`\n", strings.TrimSpace("go run ./bench/dns "+strings.Join(clusterArgs(), " ")))
	fmt.Printf("- Cluster: `k3sm server --pod-network=host` (%s), in a network namespace of its own, apiserver on %s; "+
		"%d Services in `default` created through its API (a tenth headless with an EndpointSlice of three ready endpoints, the rest with assigned ClusterIPs)\n",
		srv.version, srv.host, o.services)
	fmt.Printf("- Both servers: GOMAXPROCS=1, %s, reading that apiserver with the admin kubeconfig; TTL 5 s\n", pin)
	fmt.Printf("  - k3sm: internal/agent/dns in a child process (bench/dns -serve -kubeconfig) on %s\n", servers[0].addr)
	fmt.Printf("  - %s (bench/coredns: plugins bind, errors, cache, kubernetes) on %s, Corefile: `%s`\n", cd.version, servers[1].addr,
		strings.Join(strings.Fields(cd.corefile), " "))
	fmt.Printf("- Load: %d UDP clients x %d queries in flight, from one process; `%s A`; every answer checked; %d rounds of %s per server, alternating which goes first\n",
		o.clients, o.inflight, o.name, o.rounds, o.duration)
	fmt.Printf("- The k3sm server (the cluster, all its processes) used %.2f cores meanwhile\n", bgCPU)
	fmt.Printf("- Load average at start %s, at end %s\n\n", firstThree(load0), firstThree(load1))
	fmt.Printf("| server | median queries/s (min–max) | server CPU (cores) | answers per server CPU-second | RSS | PSS |\n|---|---:|---:|---:|---:|---:|\n")
	for i, s := range servers {
		var qps []float64
		for _, r := range s.rounds {
			qps = append(qps, r.qps)
		}
		lo, hi := span(qps)
		fmt.Printf("| %s | %.0f (%.0f–%.0f) | %.2f | %.0f | %s | %s |\n", s.label, sums[i].qps, lo, hi, sums[i].cpu, sums[i].per, mib(s.rss), mib(s.pss))
	}
	if sums[1].qps > 0 {
		fmt.Printf("\n**k3sm ÷ CoreDNS: %.2f× queries/s", sums[0].qps/sums[1].qps)
		if sums[0].per > 0 && sums[1].per > 0 {
			fmt.Printf(", %.2f× answers per CPU-second", sums[0].per/sums[1].per)
		}
		fmt.Printf("** (goal ≥ 1)\n")
	}
	fmt.Printf("\n| round | first | k3sm queries/s | k3sm CPU | CoreDNS queries/s | CoreDNS CPU | lost (k3sm/CoreDNS) | wrong |\n|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for i := range servers[0].rounds {
		k, c := servers[0].rounds[i], servers[1].rounds[i]
		first := "k3sm"
		if i%2 == 1 {
			first = "CoreDNS"
		}
		fmt.Printf("| %d | %s | %.0f | %.2f | %.0f | %.2f | %d/%d | %d |\n", i+1, first, k.qps, k.cpu, c.qps, c.cpu, k.lost, c.lost, k.bad+c.bad)
	}
}

// clusterArgs are the command line as given, without the absolute binary
// paths the outer process appended.
func clusterArgs() []string {
	args := os.Args[1:]
	if n := len(args); n >= 4 && args[n-4] == "-k3sm-bin" && args[n-2] == "-coredns" {
		args = args[:n-4]
	}
	return args
}
