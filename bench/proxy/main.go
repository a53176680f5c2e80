// Command proxy benchmarks the node's userspace Service proxy
// (internal/agent/proxy) against its floor, a direct connection to the same
// loopback backend: throughput of a bulk upload (bytes in fixed-size
// writes, acknowledged by the backend once all arrived) and the round-trip
// latency of a 1-byte ping-pong. Each round measures both, alternating
// which goes first, and the report shows medians over the rounds and the
// ratio proxied ÷ direct. It is a benchmark, not a test: nothing here
// asserts a figure.
//
// The proxy runs in this process over a fake clientset holding one Service
// (ClusterIP 127.0.0.50) and its EndpointSlice, so no cluster is needed.
// Every socket is on 127.0.0.0/8, which Linux holds on lo.
//
//	go run ./bench/proxy -rounds 5 -bytes 1073741824 -chunk 65536 -pings 20000    (or: bench/run.sh proxy)
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/bench/internal/traffic"
	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
)

type options struct {
	rounds  int
	bytes   int64
	chunk   int
	pings   int
	follows int
}

// round is one measurement of one path.
type round struct {
	mbps     float64
	p50, p99 time.Duration
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 5, "rounds; each measures the direct and the proxied path")
	flag.Int64Var(&o.bytes, "bytes", 1<<30, "bytes uploaded per throughput measurement")
	flag.IntVar(&o.chunk, "chunk", 64<<10, "bytes per write in the throughput measurement")
	flag.IntVar(&o.pings, "pings", 20000, "1-byte round trips per latency measurement")
	flag.IntVar(&o.follows, "follows", 50, "EndpointSlice changes timed until traffic follows them")
	flag.Parse()
	if o.rounds < 1 || o.bytes < 1 || o.chunk < 1 || o.pings < 1 || o.follows < 1 {
		fmt.Fprintln(os.Stderr, "bench/proxy: -rounds, -bytes, -chunk, -pings and -follows must be at least 1")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/proxy:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	loadStart := loadAvg()
	be, err := startBackend()
	if err != nil {
		return err
	}
	defer be.Close()
	direct := be.Addr().String()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	via, stop, err := startProxy(ctx, be.Addr().(*net.TCPAddr).Port)
	if err != nil {
		return err
	}
	defer stop()

	var directs, proxied []round
	for i := range o.rounds {
		paths := []string{direct, via}
		if i%2 == 1 {
			paths = []string{via, direct}
		}
		for _, addr := range paths {
			r, err := measure(addr, o)
			if err != nil {
				return fmt.Errorf("%s: %w", addr, err)
			}
			if addr == direct {
				directs = append(directs, r)
			} else {
				proxied = append(proxied, r)
			}
			fmt.Fprintf(os.Stderr, "round %d %-8s %8.1f MB/s  p50 %v  p99 %v\n", i+1, label(addr == direct), r.mbps, r.p50, r.p99)
		}
	}
	fp50, fp99, err := follow(o.follows)
	if err != nil {
		return err
	}
	report(o, directs, proxied, loadStart, loadAvg())
	fmt.Printf("\nEndpointSlice change → traffic to the new endpoint (%d moves of a Service's one endpoint, the\n", o.follows)
	fmt.Printf("ClusterIP dialled every 0.2 ms after each update; through an informer on a fake clientset, so the\napiserver's watch delivery is not included): p50 %v, p99 %v.\n",
		fp50.Round(10*time.Microsecond), fp99.Round(10*time.Microsecond))
	return nil
}

func label(direct bool) string {
	if direct {
		return "direct"
	}
	return "proxied"
}

// startBackend serves two protocols on one loopback port, chosen by the
// first byte: 'u' reads everything until EOF and answers with the byte
// count; 'p' echoes every byte back at once.
func startBackend() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveBackend(c)
		}
	}()
	return ln, nil
}

func serveBackend(c net.Conn) {
	defer c.Close()
	var mode [1]byte
	if _, err := io.ReadFull(c, mode[:]); err != nil {
		return
	}
	switch mode[0] {
	case 'u':
		n, err := io.Copy(io.Discard, c)
		if err != nil {
			return
		}
		_ = binary.Write(c, binary.BigEndian, n)
	case 'p':
		var b [1]byte
		for {
			if _, err := io.ReadFull(c, b[:]); err != nil {
				return
			}
			if _, err := c.Write(b[:]); err != nil {
				return
			}
		}
	}
}

// startProxy runs a Proxy for one Service whose endpoint is the backend and
// returns the Service's address once it serves.
func startProxy(ctx context.Context, backendPort int) (addr string, stop func(), err error) {
	const clusterIP = "127.0.0.50"
	ln, err := net.Listen("tcp", clusterIP+":0")
	if err != nil {
		return "", nil, err
	}
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bench"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: port}},
		},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: "bench-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "bench"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(backendPort))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	p, err := proxy.New(proxy.Config{
		Client:   fake.NewClientset(svc, slice),
		NodeName: "bench",
		NodeIPs:  []netip.Addr{netip.MustParseAddr("127.0.0.60")},
		Recorder: &record.FakeRecorder{},
		Log:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stop = func() { cancel(); <-done }
	addr = net.JoinHostPort(clusterIP, fmt.Sprint(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("proxy not serving %s: %w", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func measure(addr string, o options) (round, error) {
	mbps, err := throughput(addr, o.bytes, o.chunk)
	if err != nil {
		return round{}, err
	}
	p50, p99, err := latency(addr, o.pings)
	if err != nil {
		return round{}, err
	}
	return round{mbps: mbps, p50: p50, p99: p99}, nil
}

// throughput uploads n bytes in writes of chunk bytes and returns MB/s
// (10^6 bytes) from the first write to the backend's acknowledgement.
func throughput(addr string, n int64, chunk int) (float64, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return traffic.Upload(c.(*net.TCPConn), n, chunk)
}

// latency returns the median and 99th percentile of n 1-byte round trips
// on one connection.
func latency(addr string, n int) (p50, p99 time.Duration, err error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	return traffic.RoundTrips(c, n)
}

func report(o options, directs, proxied []round, loadStart, loadEnd string) {
	med := func(rs []round, f func(round) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	mb := func(r round) float64 { return r.mbps }
	p50 := func(r round) float64 { return float64(r.p50.Nanoseconds()) / 1e3 }
	p99 := func(r round) float64 { return float64(r.p99.Nanoseconds()) / 1e3 }

	fmt.Printf("## Service proxy\n\n")
	fmt.Printf("- Date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("- Machine: kernel %s, %d CPUs, %s\n", kernel(), runtime.NumCPU(), runtime.Version())
	fmt.Printf("- Program: `bench/proxy -rounds %d -bytes %d -chunk %d -pings %d`\n", o.rounds, o.bytes, o.chunk, o.pings)
	fmt.Printf("- Load average (1/5/15 min) at start %s, at end %s\n\n", loadStart, loadEnd)
	fmt.Printf("Median of %d rounds; direct = client to the loopback backend, proxied = through the\n", o.rounds)
	fmt.Printf("ClusterIP socket of internal/agent/proxy (TCP relay by splice(2)) to the same backend.\n\n")
	fmt.Printf("| | direct | proxied | ratio proxied ÷ direct |\n|---|---:|---:|---:|\n")
	row := func(name, unit string, f func(round) float64) {
		d, p := med(directs, f), med(proxied, f)
		fmt.Printf("| %s | %.1f %s | %.1f %s | %.2f× |\n", name, d, unit, p, unit, p/d)
	}
	row(fmt.Sprintf("throughput, %s upload in %d KiB writes", size(o.bytes), o.chunk>>10), "MB/s", mb)
	row(fmt.Sprintf("1-byte round trip p50 (%d pings)", o.pings), "µs", p50)
	row("1-byte round trip p99", "µs", p99)
}

func size(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d B", n)
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
