// Command dns measures the node's cluster DNS resolver (internal/agent/dns):
// queries per second for a cluster A record with the resolver on one core.
//
// It starts itself again as the server (-serve), with GOMAXPROCS=1, fed by
// a fake clientset of -services Services (a tenth of them headless, with
// three ready endpoints each), then runs a load generator of -clients
// concurrent UDP clients, each keeping -inflight queries outstanding, for
// -rounds rounds of -duration and reports the median. Every answer is
// checked (ID, NOERROR, one A record with the Service's address).
//
// With -addr it measures a DNS server that is already running instead (e.g.
// CoreDNS serving the same names), so both can be compared with the same
// load generator; -name then names the record to ask for.
//
// With -cluster it measures k3sm's resolver and CoreDNS side by side against
// one real cluster (cluster.go): it starts `k3sm server --pod-network=host`
// (-k3sm-bin) in a network namespace of its own, creates the Services
// through its API, and runs the resolver and CoreDNS (-coredns, built from
// bench/coredns) each on one core against that apiserver, with the same
// load in interleaved rounds.
//
// Everything listens on 127.0.0.0/8 (the server on -ip, 127.0.0.77 by default).
//
//	go run ./bench/dns
//	go run ./bench/dns -addr 127.0.0.78:53 -name svc-7.default.svc.cluster.local.
//	go run ./bench/dns -cluster -k3sm-bin bin/k3sm -coredns _output/bench/coredns    (root)
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/clientcmd"

	k3smdns "github.com/k3sm-dev/k3sm/internal/agent/dns"
)

type options struct {
	serve      bool
	kubeconfig string // -serve: read the cluster through this kubeconfig, not a fake clientset
	serveBin   string // the program started as the server (default: this one)
	cpu        int
	addr       string

	cluster      bool
	k3smBin      string
	coredns      string
	corednsCache int
	timeout      time.Duration
	keep         bool

	ip       string
	name     string
	want     string
	services int
	clients  int
	inflight int
	rounds   int
	duration time.Duration
	warmup   time.Duration
	profile  string
}

func main() {
	var o options
	flag.BoolVar(&o.serve, "serve", false, "internal: be the measured server (started by the benchmark itself)")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "internal: with -serve, the cluster's kubeconfig (default: a fake clientset)")
	flag.IntVar(&o.cpu, "cpu", -1, "pin the started server(s) to this CPU with taskset(1) (-1: not pinned; GOMAXPROCS=1 either way)")
	flag.BoolVar(&o.cluster, "cluster", false, "measure k3sm's resolver and CoreDNS side by side against a real `k3sm server` (needs root, -coredns)")
	flag.StringVar(&o.k3smBin, "k3sm-bin", "bin/k3sm", "with -cluster: the k3sm binary whose server is the cluster")
	flag.StringVar(&o.coredns, "coredns", "_output/bench/coredns", "with -cluster: the CoreDNS binary (cd bench/coredns && go build -o ../../_output/bench/coredns .)")
	flag.IntVar(&o.corednsCache, "coredns-cache", 0, "with -cluster: give CoreDNS the cache plugin with this TTL cap in seconds, as the stock Corefile does with 30 (0: no cache)")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "with -cluster: how long the server, the Services and both resolvers may take to be ready")
	flag.BoolVar(&o.keep, "keep", false, "with -cluster: keep the work dir (server data dir, logs, Corefile)")
	flag.StringVar(&o.addr, "addr", "", "measure the DNS server at this host:port (on 127.0.0.0/8) instead of starting k3sm's")
	flag.StringVar(&o.ip, "ip", "127.0.0.77", "loopback address the started server listens on")
	flag.StringVar(&o.name, "name", "svc-7.default.svc.cluster.local.", "name to query (type A)")
	flag.StringVar(&o.want, "want", "", "address the answer must hold (default: the fixture's address of -name; with -addr, any)")
	flag.IntVar(&o.services, "services", 1000, "Services in the fake cluster")
	flag.IntVar(&o.clients, "clients", 16, "concurrent clients, each with its own UDP socket")
	flag.IntVar(&o.inflight, "inflight", 8, "queries each client keeps outstanding")
	flag.IntVar(&o.rounds, "rounds", 5, "measured rounds; the report gives the median")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "length of one round")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "load before the first round, not counted")
	flag.StringVar(&o.profile, "cpuprofile", "", "write the server's CPU profile to this file")
	flag.Parse()
	if o.serve {
		if err := serve(o); err != nil {
			fmt.Fprintln(os.Stderr, "bench/dns -serve:", err)
			os.Exit(1)
		}
		return
	}
	if o.clients < 1 || o.inflight < 1 || o.rounds < 1 || o.duration <= 0 || o.services < 10 {
		fmt.Fprintln(os.Stderr, "bench/dns: -clients, -inflight, -rounds must be at least 1, -duration positive, -services at least 10")
		os.Exit(2)
	}
	if o.cluster {
		os.Exit(cluster(o))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/dns:", err)
		os.Exit(1)
	}
}

// fixture is the fake cluster: svc-<i>.default with ClusterIP 10.43.x.y;
// every tenth headless with three ready endpoints.
func fixture(n int) (objs []k8sruntime.Object, ipOf map[string]string) {
	ipOf = map[string]string{}
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
		}
		if i%10 == 9 {
			svc.Spec.ClusterIP = corev1.ClusterIPNone
			ready := true
			s := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
				AddressType: discoveryv1.AddressTypeIPv4,
			}
			for j := range 3 {
				s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
					Addresses:  []string{fmt.Sprintf("10.42.%d.%d", i/250, (i%250)*3%250+j)},
					Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				})
			}
			objs = append(objs, s)
		} else {
			svc.Spec.ClusterIP = fmt.Sprintf("10.43.%d.%d", i/250, i%250+1)
			ipOf[name+".default.svc.cluster.local."] = svc.Spec.ClusterIP
		}
		objs = append(objs, svc)
	}
	return objs, ipOf
}

// serve is the child: the resolver on one core. It prints its address and
// serves until stdin closes.
func serve(o options) error {
	var client kubernetes.Interface
	if o.kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
		if err != nil {
			return err
		}
		if client, err = kubernetes.NewForConfig(cfg); err != nil {
			return err
		}
	} else {
		objs, _ := fixture(o.services)
		client = fake.NewClientset(objs...)
	}
	s, err := k3smdns.New(k3smdns.Config{
		Client: client,
		Domain: "cluster.local",
		Listen: []string{net.JoinHostPort(o.ip, "0")},
		// Nothing is forwarded in this benchmark; an upstream on loopback
		// that does not exist keeps it that way if a query strays.
		Upstreams: []string{"127.0.0.79:53"},
		Log:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Ready():
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		return errors.New("resolver not ready after 30s")
	}
	if o.profile != "" {
		f, err := os.Create(o.profile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Printf("addr %s gomaxprocs %d\n", s.Addrs()[0], runtime.GOMAXPROCS(0))
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	return <-done
}

type round struct {
	qps      float64
	cpu      float64 // server CPU seconds per second (1.0 = one core busy); 0 if unknown
	lost     int64
	bad      int64
	duration time.Duration
}

func run(ctx context.Context, o options) error {
	want := o.want
	var pid int
	addr := o.addr
	if addr == "" {
		_, ipOf := fixture(o.services)
		if want == "" {
			if want = ipOf[strings.ToLower(dns.Fqdn(o.name))]; want == "" {
				return fmt.Errorf("%s is not a ClusterIP Service of the fixture; pass -want", o.name)
			}
		}
		a, p, stopServer, err := startResolver(ctx, o, "-services", strconv.Itoa(o.services), "-cpuprofile", o.profile)
		if err != nil {
			return err
		}
		defer stopServer()
		addr, pid = a, p
	}
	if ap, err := netip.ParseAddrPort(addr); err != nil || !ap.Addr().IsLoopback() {
		return fmt.Errorf("-addr %s: this benchmark only sends to 127.0.0.0/8", addr)
	}
	wantIP, packed, err := queryFor(o.name, want)
	if err != nil {
		return err
	}

	fmt.Printf("bench/dns: %s A against %s (%s), %d clients x %d in flight, %d rounds of %s\n",
		o.name, addr, map[bool]string{true: "k3sm resolver, GOMAXPROCS=1, pid " + strconv.Itoa(pid), false: "external server"}[pid != 0],
		o.clients, o.inflight, o.rounds, o.duration)
	load0 := readFile("/proc/loadavg")
	if o.warmup > 0 {
		if _, err := load(ctx, addr, packed, wantIP, o, o.warmup, 0); err != nil {
			return err
		}
	}
	var rounds []round
	for i := range o.rounds {
		r, err := load(ctx, addr, packed, wantIP, o, o.duration, pid)
		if err != nil {
			return err
		}
		fmt.Printf("round %d: %.0f queries/s, server CPU %.2f cores, %d lost, %d wrong\n", i+1, r.qps, r.cpu, r.lost, r.bad)
		rounds = append(rounds, r)
	}
	report(o, addr, pid != 0, rounds, load0, readFile("/proc/loadavg"))
	return nil
}

// startResolver starts this program again as the resolver (-serve) with
// GOMAXPROCS=1 (and pinned to -cpu), waits for its address and returns it
// with the child's pid and a function that stops it.
func startResolver(ctx context.Context, o options, args ...string) (addr string, pid int, stop func(), err error) {
	self := o.serveBin
	if self == "" {
		if self, err = os.Executable(); err != nil {
			return "", 0, nil, err
		}
	}
	cmd := pinned(ctx, o.cpu, self, append([]string{"-serve", "-ip", o.ip}, args...)...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", 0, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop = func() { stdin.Close(); _ = cmd.Wait() }
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return "", 0, nil, fmt.Errorf("server did not start: %v", err)
	}
	f := strings.Fields(line)
	if len(f) < 4 || f[0] != "addr" || f[3] != "1" {
		stop()
		return "", 0, nil, fmt.Errorf("server said %q, want addr <a> gomaxprocs 1", line)
	}
	return f[1], cmd.Process.Pid, stop, nil
}

// pinned is a command for name and args, run under `taskset -c cpu` when
// cpu >= 0. taskset execs the program, so the pid is the program's.
func pinned(ctx context.Context, cpu int, name string, args ...string) *exec.Cmd {
	if cpu < 0 {
		return exec.CommandContext(ctx, name, args...)
	}
	return exec.CommandContext(ctx, "taskset", append([]string{"-c", strconv.Itoa(cpu), name}, args...)...)
}

// queryFor packs an A query for name and parses the address an answer must
// hold (nil: any).
func queryFor(name, want string) (wantIP, packed []byte, err error) {
	if want != "" {
		ip, err := netip.ParseAddr(want)
		if err != nil || !ip.Is4() {
			return nil, nil, fmt.Errorf("-want %q is not an IPv4 address", want)
		}
		wantIP = ip.AsSlice()
	}
	query := new(dns.Msg)
	query.SetQuestion(dns.Fqdn(name), dns.TypeA)
	packed, err = query.Pack()
	return wantIP, packed, err
}

// load runs the clients for d and counts checked answers.
func load(ctx context.Context, addr string, query, wantIP []byte, o options, d time.Duration, pid int) (round, error) {
	var ok, lost, bad atomic.Int64
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	conns := make([]*net.UDPConn, o.clients)
	for i := range conns {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return round{}, err
		}
		conns[i] = c.(*net.UDPConn)
		defer c.Close()
	}
	cpu0 := cpuSeconds(pid)
	start := time.Now()
	var wg sync.WaitGroup
	for ci, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := slices.Clone(query)
			resp := make([]byte, 1500)
			id := uint16(ci << 12)
			send := func() {
				id++
				binary.BigEndian.PutUint16(q, id)
				_, _ = c.Write(q)
			}
			for range o.inflight {
				send()
			}
			for ctx.Err() == nil {
				_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				n, err := c.Read(resp)
				if err != nil {
					if ctx.Err() == nil {
						lost.Add(1) // a query or its answer was dropped: replace it
						send()
					}
					continue
				}
				if check(resp[:n], wantIP) {
					ok.Add(1)
				} else {
					bad.Add(1)
				}
				send()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	r := round{qps: float64(ok.Load()) / el.Seconds(), lost: lost.Load(), bad: bad.Load(), duration: el}
	if pid != 0 {
		r.cpu = (cpuSeconds(pid) - cpu0) / el.Seconds()
	}
	if bad.Load() > 0 && ok.Load() == 0 {
		return r, fmt.Errorf("no answer was right: is %s serving the name?", addr)
	}
	return r, nil
}

// check reads an answer without unpacking it: a response, NOERROR, one
// answer record, whose last four bytes (the A record's data, last in a
// message without additional records) are wantIP.
func check(b, wantIP []byte) bool {
	if len(b) < 12 || b[2]&0x80 == 0 || b[3]&0x0f != 0 || binary.BigEndian.Uint16(b[6:]) != 1 {
		return false
	}
	return wantIP == nil || string(b[len(b)-4:]) == string(wantIP)
}

// cpuSeconds is the user+system time of pid from /proc (0 if unknown).
func cpuSeconds(pid int) float64 {
	if pid == 0 {
		return 0
	}
	s := readFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

func median(v []float64) float64 {
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func report(o options, addr string, own bool, rounds []round, load0, load1 string) {
	var qps, cpu []float64
	for _, r := range rounds {
		qps = append(qps, r.qps)
		cpu = append(cpu, r.cpu)
	}
	host, _ := os.Hostname()
	fmt.Printf("\n## Cluster DNS\n\n")
	fmt.Printf("- Date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("- Machine: %s, %d CPUs, %s\n", host, runtime.NumCPU(), cpuModel())
	fmt.Printf("- Command: `%s`\n", strings.TrimSpace("go run ./bench/dns "+strings.Join(os.Args[1:], " ")))
	if own {
		fmt.Printf("- Server: k3sm's resolver (internal/agent/dns) in a child process with GOMAXPROCS=1, %d Services\n", o.services)
	} else {
		fmt.Printf("- Server: external, at %s\n", addr)
	}
	fmt.Printf("- Load: %d UDP clients x %d queries in flight, from one process; `%s A`\n", o.clients, o.inflight, o.name)
	fmt.Printf("- Load average at start %s, at end %s\n\n", firstThree(load0), firstThree(load1))
	fmt.Printf("**median %.0f queries/s** over %d rounds of %s", median(qps), len(rounds), o.duration)
	if own {
		// On a shared machine the server may not get its core all the time:
		// answers per CPU-second say what one busy core would give.
		var perCore []float64
		for _, r := range rounds {
			if r.cpu > 0 {
				perCore = append(perCore, r.qps/r.cpu)
			}
		}
		fmt.Printf(" (server CPU median %.2f cores", median(cpu))
		if len(perCore) > 0 {
			fmt.Printf("; median %.0f answers per server CPU-second", median(perCore))
		}
		fmt.Printf(")")
	}
	fmt.Printf("\n\n| round | queries/s | server CPU (cores) | answers per server CPU-second | lost | wrong |\n|---:|---:|---:|---:|---:|---:|\n")
	for i, r := range rounds {
		per := "?"
		if r.cpu > 0 {
			per = fmt.Sprintf("%.0f", r.qps/r.cpu)
		}
		fmt.Printf("| %d | %.0f | %.2f | %s | %d | %d |\n", i+1, r.qps, r.cpu, per, r.lost, r.bad)
	}
}

func firstThree(loadavg string) string {
	f := strings.Fields(loadavg)
	return strings.Join(f[:min(3, len(f))], " ")
}

func cpuModel() string {
	for _, l := range strings.Split(readFile("/proc/cpuinfo"), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
