package apilb

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

const wait = 10 * time.Second

// backend is a stand-in apiserver on 127.0.0.1: it greets each connection
// with its name and a newline, then echoes what it reads.
type backend struct {
	t    *testing.T
	name string
	addr string

	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
	wg    sync.WaitGroup
}

func newBackend(t *testing.T, name string) *backend {
	b := &backend{t: t, name: name}
	b.listen("127.0.0.1:0")
	t.Cleanup(func() {
		b.stop()
		b.dropConns()
		b.wg.Wait()
	})
	return b
}

func (b *backend) listen(addr string) {
	b.t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		b.t.Fatalf("backend %s: %v", b.name, err)
	}
	b.mu.Lock()
	b.ln, b.addr = ln, ln.Addr().String()
	b.mu.Unlock()
	b.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			b.wg.Go(func() {
				defer c.Close()
				if _, err := io.WriteString(c, b.name+"\n"); err != nil {
					return
				}
				io.Copy(c, c)
			})
		}
	})
}

// stop closes the listener: new dials are refused, accepted connections
// live on.
func (b *backend) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ln != nil {
		b.ln.Close()
		b.ln = nil
	}
}

// restart listens again on the same address.
func (b *backend) restart() { b.listen(b.addr) }

// dropConns closes every accepted connection.
func (b *backend) dropConns() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
	b.conns = nil
}

// client is a connection through the load balancer.
type client struct {
	t    *testing.T
	c    net.Conn
	r    *bufio.Reader
	name string // the backend that greeted it
}

// connect dials lb and reads the backend's greeting.
func connect(t *testing.T, lb *LB) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", lb.Addr(), wait)
	if err != nil {
		t.Fatalf("dial %s: %v", lb.Addr(), err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(wait))
	cl := &client{t: t, c: c, r: bufio.NewReader(c)}
	line, err := cl.r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the backend's greeting through %s: %v", lb.Addr(), err)
	}
	cl.name = strings.TrimSuffix(line, "\n")
	return cl
}

func (cl *client) echo(msg string) {
	cl.t.Helper()
	if _, err := io.WriteString(cl.c, msg+"\n"); err != nil {
		cl.t.Fatalf("write to %s: %v", cl.name, err)
	}
	got, err := cl.r.ReadString('\n')
	if err != nil || got != msg+"\n" {
		cl.t.Fatalf("echo from %s = %q, %v; want %q", cl.name, got, err, msg)
	}
}

// closed checks that the proxy closed the connection.
func (cl *client) closed() {
	cl.t.Helper()
	b, err := cl.r.ReadByte()
	if err == nil {
		cl.t.Fatalf("read %q from a connection that should be closed", b)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		cl.t.Fatalf("connection to %s still open: %v", cl.name, err)
	}
}

// syncBuffer collects log output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newLB(t *testing.T, o Options) *LB {
	t.Helper()
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
		if testing.Verbose() {
			o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	}
	lb, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.ln.Close() })
	return lb
}

// run runs lb until the test ends and checks that Run then returns nil.
func run(t *testing.T, lb *LB) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- lb.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return after its context ended")
		}
	})
}

func wantServers(t *testing.T, lb *LB, want ...string) {
	t.Helper()
	if got := lb.Servers(); !slices.Equal(got, want) {
		t.Fatalf("Servers() = %v, want %v", got, want)
	}
	if got := lb.Current(); got != want[0] {
		t.Fatalf("Current() = %s, want %s", got, want[0])
	}
}

func TestProxiesToFirstServerAndSticks(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	lb := newLB(t, Options{Servers: []string{a.addr, b.addr}})
	if !strings.HasPrefix(lb.Addr(), "127.0.0.1:") || lb.URL() != "https://"+lb.Addr() {
		t.Fatalf("Addr() = %s, URL() = %s", lb.Addr(), lb.URL())
	}
	run(t, lb)
	for i := range 5 {
		cl := connect(t, lb)
		if cl.name != "a" {
			t.Fatalf("connection %d reached %s, want a (the first server, while it accepts)", i, cl.name)
		}
		cl.echo(strings.Repeat("hello", 10000))
	}
	wantServers(t, lb, a.addr, b.addr)
}

func TestFailsOverTransparentlyAndStaysOnTheNewServer(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	lb := newLB(t, Options{Servers: []string{a.addr, b.addr}})
	run(t, lb)
	old := connect(t, lb)

	a.stop() // a refuses new connections; old lives on
	if cl := connect(t, lb); cl.name != "b" {
		t.Fatalf("with a down, a new connection reached %s, want b", cl.name)
	}
	wantServers(t, lb, b.addr, a.addr)
	old.echo("the connection to the old server is left alone")

	a.restart()
	if cl := connect(t, lb); cl.name != "b" {
		t.Fatalf("a is back but b still works: a new connection reached %s, want b (sticky)", cl.name)
	}

	b.stop()
	if cl := connect(t, lb); cl.name != "a" {
		t.Fatalf("with b down, a new connection reached %s, want a", cl.name)
	}
	wantServers(t, lb, a.addr, b.addr)
}

// A server whose dial failed is passed over for retryAfter, unless only
// failed ones are left; every server is tried once per client connection.
func TestFailedServerBackoff(t *testing.T) {
	for _, expired := range []bool{false, true} {
		t.Run(map[bool]string{false: "within", true: "after"}[expired], func(t *testing.T) {
			a, b, c := newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")
			lb := newLB(t, Options{Servers: []string{a.addr, b.addr, c.addr}})
			var skew atomic.Int64
			lb.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
			run(t, lb)

			a.stop()
			if cl := connect(t, lb); cl.name != "b" {
				t.Fatalf("with a down, reached %s, want b", cl.name)
			}
			a.restart()
			lb.Update([]string{b.addr, a.addr, c.addr}) // a is next after b
			wantServers(t, lb, b.addr, a.addr, c.addr)
			if expired {
				skew.Store(int64(lb.retryAfter + time.Second))
			}
			b.stop()
			want := "c" // a failed recently: passed over
			if expired {
				want = "a"
			}
			if cl := connect(t, lb); cl.name != want {
				t.Fatalf("with b down, reached %s, want %s", cl.name, want)
			}
			if !expired {
				// b and a are failed: once c fails too, both are tried anyway.
				c.stop()
				if cl := connect(t, lb); cl.name != "a" {
					t.Fatalf("with only a up (failed recently), reached %s, want a", cl.name)
				}
				wantServers(t, lb, a.addr, c.addr, b.addr)
			}
		})
	}
}

func TestNoServerClosesTheClient(t *testing.T) {
	a := newBackend(t, "a")
	logs := &syncBuffer{}
	lb := newLB(t, Options{Servers: []string{a.addr}, Log: slog.New(slog.NewTextHandler(logs, nil))})
	run(t, lb)
	a.stop()
	for range 3 {
		c, err := net.Dial("tcp", lb.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(wait))
		(&client{t: t, c: c, r: bufio.NewReader(c), name: "none"}).closed()
		c.Close()
	}
	if n := strings.Count(logs.String(), "no apiserver reachable"); n != 1 {
		t.Errorf("logged %d times that no apiserver is reachable, want once:\n%s", n, logs)
	}
	a.restart()
	connect(t, lb).echo("back")
	if !strings.Contains(logs.String(), "apiserver reachable again") {
		t.Errorf("recovery not logged:\n%s", logs)
	}
}

func TestBackendClosingClosesTheClient(t *testing.T) {
	a := newBackend(t, "a")
	lb := newLB(t, Options{Servers: []string{a.addr}})
	run(t, lb)
	cl := connect(t, lb)
	cl.echo("before")
	a.dropConns()
	cl.closed()
	poll.Until(t, wait, "the proxied connection to be forgotten", func() bool { return lb.open() == 0 })
	connect(t, lb).echo("a new connection works")
}

func TestClientHalfClosePassesThrough(t *testing.T) {
	a := newBackend(t, "a")
	lb := newLB(t, Options{Servers: []string{a.addr}})
	run(t, lb)
	cl := connect(t, lb)
	io.WriteString(cl.c, "last words\n")
	if err := cl.c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The echo backend answers, sees EOF and closes: the reply still
	// arrives, then EOF.
	rest, err := io.ReadAll(cl.r)
	if err != nil || string(rest) != "last words\n" {
		t.Fatalf("after half-close read %q, %v; want the echo then EOF", rest, err)
	}
}

func TestUpdate(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	lb := newLB(t, Options{Servers: []string{a.addr, b.addr}})
	run(t, lb)
	toA := connect(t, lb)

	lb.Update([]string{b.addr, a.addr}) // a still listed: stays current
	wantServers(t, lb, a.addr, b.addr)
	toA.echo("a still listed")

	lb.Update([]string{b.addr})
	wantServers(t, lb, b.addr)
	toA.closed()
	if cl := connect(t, lb); cl.name != "b" {
		t.Fatalf("after a was removed, reached %s, want b", cl.name)
	}

	for _, l := range [][]string{nil, {}, {"not-an-address"}} {
		lb.Update(l)
		wantServers(t, lb, b.addr)
	}
	lb.Update([]string{a.addr, "bad", a.addr, b.addr})
	wantServers(t, lb, b.addr, a.addr)
}

func TestRunEndClosesEverything(t *testing.T) {
	a := newBackend(t, "a")
	lb := newLB(t, Options{Servers: []string{a.addr}})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- lb.Run(ctx) }()
	cl := connect(t, lb)
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	cl.closed()
	if c, err := net.Dial("tcp", lb.Addr()); err == nil {
		c.Close()
		t.Fatal("still listening after Run returned")
	}
	if err := lb.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "New") {
		t.Fatalf("second Run = %v, want an error saying to make a new one", err)
	}
}

func TestStateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent", "apiservers.json")
	s1, s2, s3, s4 := "127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003", "127.0.0.1:1004"
	lb := newLB(t, Options{Servers: []string{s1}, StateFile: path})
	// Written at once: a join's list is kept even if it never changes.
	if data, err := os.ReadFile(path); err != nil || !strings.Contains(string(data), s1) {
		t.Fatalf("state file after New: %v %s", err, data)
	}
	lb.Update([]string{s1, s2, s3})
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %v, want 0600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(path)
	var st state
	if err := json.Unmarshal(data, &st); err != nil || !slices.Equal(st.Servers, []string{s1, s2, s3}) {
		t.Fatalf("state file holds %s (%v), want servers %v", data, err, []string{s1, s2, s3})
	}

	lb2 := newLB(t, Options{Servers: []string{s4, s2}, StateFile: path})
	wantServers(t, lb2, s4, s2, s1, s3)

	// What cannot be used is skipped, never fatal.
	os.WriteFile(path, []byte(`{"servers":["bad", "127.0.0.1:01003"]}`), 0o600)
	wantServers(t, newLB(t, Options{Servers: []string{s4}, StateFile: path}), s4, s3)
	os.WriteFile(path, []byte("{not json"), 0o600)
	wantServers(t, newLB(t, Options{Servers: []string{s4}, StateFile: path}), s4)
}

func TestBadServersRefused(t *testing.T) {
	for _, bad := range []string{"10.0.0.1", "https://10.0.0.1:6443", ":6443", "host:0", "host:65536", "host:https", "a b:1", "[::1:6443"} {
		_, err := New(Options{Listen: "127.0.0.1:0", Servers: []string{"127.0.0.1:6443", bad}})
		if err == nil || !strings.Contains(err.Error(), `"`+bad+`"`) || !strings.Contains(err.Error(), "host:port") {
			t.Errorf("New with server %q: error %v, want one naming it and asking for host:port", bad, err)
		}
	}
	if _, err := New(Options{Listen: "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "at least one") {
		t.Errorf("New without servers: %v", err)
	}
	if _, err := New(Options{Servers: []string{"127.0.0.1:6443"}}); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Errorf("New without a listen address: %v", err)
	}
	lb := newLB(t, Options{Servers: []string{"127.0.0.1:06443", "[::1]:6443", "localhost:6443", "127.0.0.1:6443"}})
	wantServers(t, lb, "127.0.0.1:6443", "[::1]:6443", "localhost:6443")
}

func TestFollow(t *testing.T) {
	logs := &syncBuffer{}
	// The addresses below are documentation ones, never dialled: Run is
	// not called.
	lb := newLB(t, Options{Servers: []string{"192.0.2.1:6443"}, Log: slog.New(slog.NewTextHandler(logs, nil))})
	kc := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Follow(ctx, kc, lb)
		close(done)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(wait):
			t.Error("Follow did not return after its context ended")
		}
	}()

	ready := func(addr string, r bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &r}}
	}
	str := func(s string) *string { return &s }
	port := func(p int32) *int32 { return &p }
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{ready("192.0.2.11", true), ready("192.0.2.12", false), ready("192.0.2.10", true)},
		Ports:       []discoveryv1.EndpointPort{{Name: str("metrics"), Port: port(1)}, {Name: str("https"), Port: port(6443)}},
	}
	other := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-abc", Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{ready("192.0.2.99", true)},
		Ports:       []discoveryv1.EndpointPort{{Name: str("https"), Port: port(443)}},
	}
	es := kc.DiscoveryV1().EndpointSlices("default")
	for _, s := range []*discoveryv1.EndpointSlice{other, slice} {
		if _, err := es.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	follows := func(want ...string) {
		t.Helper()
		poll.Until(t, wait, "Servers() = "+strings.Join(want, ","), func() bool { return slices.Equal(lb.Servers(), want) })
	}
	follows("192.0.2.10:6443", "192.0.2.11:6443")

	slice.Endpoints = []discoveryv1.Endpoint{ready("192.0.2.10", false), ready("192.0.2.11", true), ready("192.0.2.12", true)}
	if _, err := es.Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	follows("192.0.2.11:6443", "192.0.2.12:6443")

	slice.Endpoints = nil
	if _, err := es.Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, wait, "the empty endpoints to be logged", func() bool {
		return strings.Contains(logs.String(), "no ready apiserver endpoint")
	})
	if err := es.Delete(ctx, slice.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	wantServers(t, lb, "192.0.2.11:6443", "192.0.2.12:6443")

	v6 := slice.DeepCopy()
	v6.Name, v6.ResourceVersion, v6.AddressType = "kubernetes-v6", "", discoveryv1.AddressTypeIPv6
	v6.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"2001:db8::1"}}} // Ready unset: ready
	if _, err := es.Create(ctx, v6, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	follows("[2001:db8::1]:6443")
}
