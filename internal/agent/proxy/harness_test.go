package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// Every address in these tests is in 127.0.0.0/8, which Linux holds on lo:
// clusterIP plays a Service's ClusterIP and nodeIP the node's address.
const (
	testNS    = "default"
	testNode  = "node-a"
	clusterIP = "127.0.0.50"
	nodeIP    = "127.0.0.60"
)

type harness struct {
	t      *testing.T
	client *fake.Clientset
	p      *Proxy
	rec    *record.FakeRecorder
	stop   func() // stops the Proxy and checks for goroutines left; idempotent
}

// start runs a Proxy over a fake clientset holding objs and stops it when
// the test ends, checking then that none of its goroutines is left.
func start(t *testing.T, tweak func(*Config), objs ...k8sruntime.Object) *harness {
	t.Helper()
	return startWith(t, tweak, nil, objs...)
}

// startWith is start with prep called on the Proxy before it runs.
func startWith(t *testing.T, tweak func(*Config), prep func(*Proxy), objs ...k8sruntime.Object) *harness {
	t.Helper()
	client := fake.NewClientset(objs...)
	// Informers miss what changes between their list and their watch on a
	// fake clientset: wait for both watches before the test changes things.
	var mu sync.Mutex
	watching := map[string]bool{}
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		watching[a.GetResource().Resource] = true
		mu.Unlock()
		return false, nil, nil
	})
	rec := record.NewFakeRecorder(100)
	cfg := Config{
		Client:        client,
		NodeName:      testNode,
		NodeIPs:       []netip.Addr{netip.MustParseAddr(nodeIP)},
		Recorder:      rec,
		Log:           slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		RetryInterval: 200 * time.Millisecond,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if prep != nil {
		prep(p)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stop := sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
			return
		}
		if g := proxyGoroutines(); len(g) > 0 {
			t.Errorf("goroutines left after Run returned:\n%s", strings.Join(g, "\n\n"))
		}
	})
	t.Cleanup(stop)
	poll.Until(t, 10*time.Second, "informers watching", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return watching["services"] && watching["endpointslices"]
	})
	return &harness{t: t, client: client, p: p, rec: rec, stop: stop}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// proxyGoroutines lists the stacks of goroutines running the proxy's
// serving code (accept loops, relays, UDP sessions, the worker).
func proxyGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, fn := range []string{"proxy.(*frontend).", "proxy.(*Proxy).relay", "proxy.pipe(", "proxy.(*udpFront).serve", "proxy.(*session).serve", "proxy.(*Proxy).processNext"} {
			if strings.Contains(g, fn) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// settledGoroutines waits until only the goroutines the tests expect while
// the proxy idles are left (accept loops, UDP readers, the worker).
func settledGoroutines(t *testing.T) {
	t.Helper()
	poll.UntilNil(t, 5*time.Second, "the per-connection goroutines to end", func() error {
		var left []string
		for _, g := range proxyGoroutines() {
			for _, fn := range []string{"proxy.(*frontend).serveTCP", "proxy.(*Proxy).relay", "proxy.pipe(", "proxy.(*session).serve"} {
				if strings.Contains(g, fn) {
					left = append(left, g)
					break
				}
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("left:\n%s", strings.Join(left, "\n\n"))
		}
		return nil
	})
}

// freePort returns a port nothing listens on at ip for proto.
func freePort(t *testing.T, ip string, proto corev1.Protocol) int32 {
	t.Helper()
	if proto == corev1.ProtocolUDP {
		c, err := net.ListenPacket("udp", ip+":0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return int32(c.LocalAddr().(*net.UDPAddr).Port)
	}
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return int32(ln.Addr().(*net.TCPAddr).Port)
}

// backend is a TCP server on 127.0.0.1 that, per connection, writes its
// name and a newline and then echoes what it reads.
type backend struct {
	name string
	port int32
	ln   net.Listener
}

func tcpBackend(t *testing.T, name string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, port: int32(ln.Addr().(*net.TCPAddr).Port), ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				if _, err := io.WriteString(c, name+"\n"); err != nil {
					return
				}
				_, _ = io.Copy(c, c)
			})
		}
	})
	return b
}

// udpBackend answers each datagram with "<name>:<datagram>".
func udpBackend(t *testing.T, name string) int32 {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { c.Close(); wg.Wait() })
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteTo(append([]byte(name+":"), buf[:n]...), from)
		}
	})
	return int32(c.LocalAddr().(*net.UDPAddr).Port)
}

// ask connects to addr and returns the name of the backend that answered.
func ask(addr string) (string, error) {
	return askFrom(nil, addr)
}

func askFrom(local net.Addr, addr string) (string, error) {
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: local}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(line, "\n"), nil
}

func mustAsk(t *testing.T, addr string) string {
	t.Helper()
	name, err := ask(addr)
	if err != nil {
		t.Fatalf("through %s: %v", addr, err)
	}
	return name
}

func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// waitRefused waits until connecting to addr is refused and returns how
// long that took.
func waitRefused(t *testing.T, addr string) time.Duration {
	t.Helper()
	t0 := time.Now()
	// Every 2 ms: the time it took is the measure.
	poll.Every(t, context.Background(), 5*time.Second, 2*time.Millisecond, addr+" to refuse connections", func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return errors.New("accepted")
		}
		if refused(err) {
			return nil
		}
		return err
	})
	return time.Since(t0)
}

// waitServed waits until a backend answers through addr and returns its
// name and how long that took.
func waitServed(t *testing.T, addr string) (string, time.Duration) {
	t.Helper()
	t0 := time.Now()
	var name string
	// Every 2 ms: the time it took is the measure.
	poll.Every(t, context.Background(), 5*time.Second, 2*time.Millisecond, "a backend to answer through "+addr, func() (err error) {
		name, err = ask(addr)
		return err
	})
	return name, time.Since(t0)
}

func hostPort(ip string, port int32) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }

func service(name string, typ corev1.ServiceType, ip string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name},
		Spec: corev1.ServiceSpec{
			Type:       typ,
			ClusterIP:  ip,
			ClusterIPs: []string{ip},
			Ports:      ports,
		},
	}
}

func svcPort(name string, proto corev1.Protocol, port, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port, NodePort: nodePort}
}

// slice is an EndpointSlice of service svc with one port for all endpoints.
func slice(svc, name string, proto corev1.Protocol, portName string, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: testNS, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Protocol: ptr.To(proto), Port: ptr.To(port)}},
		Endpoints:   eps,
	}
}

func ready(ip string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(testNode)}
}

func (h *harness) createSlice(s *discoveryv1.EndpointSlice) {
	h.t.Helper()
	if _, err := h.client.DiscoveryV1().EndpointSlices(testNS).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) updateSlice(s *discoveryv1.EndpointSlice) {
	h.t.Helper()
	if _, err := h.client.DiscoveryV1().EndpointSlices(testNS).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) deleteSlice(name string) {
	h.t.Helper()
	if err := h.client.DiscoveryV1().EndpointSlices(testNS).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) updateService(s *corev1.Service) {
	h.t.Helper()
	if _, err := h.client.CoreV1().Services(testNS).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}
