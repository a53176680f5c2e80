package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

const tcp, udp = corev1.ProtocolTCP, corev1.ProtocolUDP

func TestClusterIPBalancesAndFollowsEndpoints(t *testing.T) {
	a, b := tcpBackend(t, "a"), tcpBackend(t, "b")
	port := freePort(t, clusterIP, tcp)
	addr := hostPort(clusterIP, port)
	h := start(t, nil,
		service("web", corev1.ServiceTypeClusterIP, clusterIP, svcPort("http", tcp, port, 0)),
		slice("web", "web-a", tcp, "http", a.port, ready("127.0.0.1")),
		slice("web", "web-b", tcp, "http", b.port, ready("127.0.0.1")),
	)
	waitServed(t, addr)

	seen := map[string]int{}
	for range 20 {
		seen[mustAsk(t, addr)]++
	}
	if seen["a"] != 10 || seen["b"] != 10 {
		t.Errorf("round robin over two endpoints: %v", seen)
	}

	h.deleteSlice("web-a")
	h.deleteSlice("web-b")
	d := waitRefused(t, addr)
	t.Logf("no endpoints -> connection refused after %v", d)
	if d > time.Second {
		t.Errorf("refused only after %v", d)
	}

	h.createSlice(slice("web", "web-b", tcp, "http", b.port, ready("127.0.0.1")))
	name, d := waitServed(t, addr)
	t.Logf("new endpoint -> served after %v", d)
	if d > time.Second {
		t.Errorf("served only after %v", d)
	}
	if name != "b" {
		t.Errorf("served by %q", name)
	}
}

func TestSessionAffinity(t *testing.T) {
	a, b := tcpBackend(t, "a"), tcpBackend(t, "b")
	port := freePort(t, clusterIP, tcp)
	addr := hostPort(clusterIP, port)
	svc := service("web", corev1.ServiceTypeClusterIP, clusterIP, svcPort("", tcp, port, 0))
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	h := start(t, nil, svc,
		slice("web", "web-a", tcp, "", a.port, ready("127.0.0.1")),
		slice("web", "web-b", tcp, "", b.port, ready("127.0.0.1")),
	)
	first, _ := waitServed(t, addr)
	for range 10 {
		if got := mustAsk(t, addr); got != first {
			t.Fatalf("affinity broken: %q then %q", first, got)
		}
	}
	// The sticky endpoint goes away: the client moves, and stays, on the other.
	h.deleteSlice("web-" + first)
	other := map[string]string{"a": "b", "b": "a"}[first]
	poll.Until(t, 10*time.Second, "client moved", func() bool { n, err := ask(addr); return err == nil && n == other })
	for range 5 {
		if got := mustAsk(t, addr); got != other {
			t.Fatalf("after the move: %q", got)
		}
	}
}

func TestRetriesRefusingEndpoint(t *testing.T) {
	b := tcpBackend(t, "b")
	dead := freePort(t, "127.0.0.1", tcp)
	port := freePort(t, clusterIP, tcp)
	addr := hostPort(clusterIP, port)
	start(t, nil,
		service("web", corev1.ServiceTypeClusterIP, clusterIP, svcPort("http", tcp, port, 0)),
		slice("web", "web-dead", tcp, "http", dead, ready("127.0.0.1")),
		slice("web", "web-b", tcp, "http", b.port, ready("127.0.0.1")),
	)
	waitServed(t, addr)
	for range 10 {
		if got := mustAsk(t, addr); got != "b" {
			t.Fatalf("served by %q", got)
		}
	}
}

func TestAllEndpointsRefuseResetsClient(t *testing.T) {
	dead := freePort(t, "127.0.0.1", tcp)
	port := freePort(t, clusterIP, tcp)
	start(t, nil,
		service("web", corev1.ServiceTypeClusterIP, clusterIP, svcPort("http", tcp, port, 0)),
		slice("web", "web-dead", tcp, "http", dead, ready("127.0.0.1")),
	)
	addr := hostPort(clusterIP, port)
	poll.Until(t, 10*time.Second, "listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if name, err := ask(addr); err == nil {
		t.Fatalf("served by %q through a dead endpoint", name)
	}
}

func TestTerminatingFallback(t *testing.T) {
	a, b, c := tcpBackend(t, "a"), tcpBackend(t, "b"), tcpBackend(t, "c")
	port := freePort(t, clusterIP, tcp)
	addr := hostPort(clusterIP, port)
	terminating := func(serving bool) discoveryv1.Endpoint {
		e := ready("127.0.0.1")
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(serving), Terminating: ptr.To(true)}
		return e
	}
	h := start(t, nil,
		service("web", corev1.ServiceTypeClusterIP, clusterIP, svcPort("http", tcp, port, 0)),
		slice("web", "web-a", tcp, "http", a.port, terminating(true)),
		slice("web", "web-b", tcp, "http", b.port, terminating(false)),
	)
	// No ready endpoint: the serving terminating one takes the traffic,
	// never the one that stopped serving.
	waitServed(t, addr)
	for range 6 {
		if got := mustAsk(t, addr); got != "a" {
			t.Fatalf("served by %q", got)
		}
	}
	// A ready endpoint wins over terminating ones.
	h.createSlice(slice("web", "web-c", tcp, "http", c.port, ready("127.0.0.1")))
	poll.Until(t, 10*time.Second, "ready endpoint used", func() bool { n, err := ask(addr); return err == nil && n == "c" })
	for range 6 {
		if got := mustAsk(t, addr); got != "c" {
			t.Fatalf("served by %q", got)
		}
	}
	// Nothing serving: refused.
	h.deleteSlice("web-a")
	h.deleteSlice("web-c")
	waitRefused(t, addr)
}

func TestTrafficPolicyLocal(t *testing.T) {
	a, b := tcpBackend(t, "a"), tcpBackend(t, "b")
	port := freePort(t, clusterIP, tcp)
	nodePort := freePort(t, nodeIP, tcp)
	remote := ready("127.0.0.1")
	remote.NodeName = ptr.To("node-b")
	svc := service("web", corev1.ServiceTypeNodePort, clusterIP, svcPort("http", tcp, port, nodePort))
	svc.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	h := start(t, nil, svc,
		slice("web", "web-a", tcp, "http", a.port, ready("127.0.0.1")),
		slice("web", "web-b", tcp, "http", b.port, remote),
	)
	cluster, node := hostPort(clusterIP, port), hostPort(nodeIP, nodePort)
	waitServed(t, cluster)
	waitServed(t, node)
	count := func(addr string) map[string]int {
		seen := map[string]int{}
		for range 8 {
			seen[mustAsk(t, addr)]++
		}
		return seen
	}
	// internalTrafficPolicy Local: the ClusterIP goes to this node's
	// endpoint only; the NodePort (externalTrafficPolicy Cluster) to both.
	if got := count(cluster); got["a"] != 8 {
		t.Errorf("ClusterIP with internalTrafficPolicy Local: %v", got)
	}
	if got := count(node); got["a"] != 4 || got["b"] != 4 {
		t.Errorf("NodePort with externalTrafficPolicy Cluster: %v", got)
	}

	svc.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster)
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	h.updateService(svc)
	poll.Until(t, 10*time.Second, "policies swapped", func() bool {
		n, err := ask(cluster)
		return err == nil && n == "b"
	})
	if got := count(node); got["a"] != 8 {
		t.Errorf("NodePort with externalTrafficPolicy Local: %v", got)
	}
	if got := count(cluster); got["a"] != 4 || got["b"] != 4 {
		t.Errorf("ClusterIP with internalTrafficPolicy Cluster: %v", got)
	}

	// No local endpoint left: the NodePort is refused, the ClusterIP serves.
	h.deleteSlice("web-a")
	waitRefused(t, node)
	if got := mustAsk(t, cluster); got != "b" {
		t.Errorf("ClusterIP served by %q", got)
	}
}

func TestUDP(t *testing.T) {
	u := udpBackend(t, "u")
	port := freePort(t, clusterIP, udp)
	addr := hostPort(clusterIP, port)
	h := start(t, func(c *Config) { c.UDPIdleTimeout = 300 * time.Millisecond },
		service("dns", corev1.ServiceTypeClusterIP, clusterIP, svcPort("dns", udp, port, 0)),
		slice("dns", "dns-u", udp, "dns", u, ready("127.0.0.1")),
	)
	exchange := func(c net.Conn, msg string) (string, error) {
		if _, err := c.Write([]byte(msg)); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		buf := make([]byte, 100)
		n, err := c.Read(buf)
		return string(buf[:n]), err
	}
	for i := range 2 { // two clients, two sessions
		c, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		poll.Until(t, 10*time.Second, "UDP echo", func() bool { r, err := exchange(c, "ping"); return err == nil && r == "u:ping" })
		if r, err := exchange(c, strings.Repeat("x", i+1)); err != nil || r != "u:"+strings.Repeat("x", i+1) {
			t.Fatalf("second datagram: %q, %v", r, err)
		}
	}
	// Idle sessions end.
	settledGoroutines(t)

	// No endpoints: the socket closes, and the kernel refuses.
	h.deleteSlice("dns-u")
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	poll.Until(t, 10*time.Second, "UDP refused", func() bool { _, err := exchange(c, "ping"); return refused(err) })
}

func TestNodePort(t *testing.T) {
	a := tcpBackend(t, "a")
	port := freePort(t, clusterIP, tcp)
	nodePort := freePort(t, nodeIP, tcp)
	start(t, nil,
		service("web", corev1.ServiceTypeNodePort, clusterIP, svcPort("http", tcp, port, nodePort)),
		slice("web", "web-a", tcp, "http", a.port, ready("127.0.0.1")),
	)
	waitServed(t, hostPort(nodeIP, nodePort))
	waitServed(t, hostPort(clusterIP, port))
	// The node port is not opened on other addresses.
	if _, err := ask(hostPort("127.0.0.1", nodePort)); !refused(err) {
		t.Errorf("node port on 127.0.0.1: %v", err)
	}
}

func TestLoadBalancer(t *testing.T) {
	const nodeIP2 = "127.0.0.61"
	a := tcpBackend(t, "a")
	port := freePort(t, nodeIP, tcp)
	// The port is taken on the second node IP until the test lets go.
	holder, err := net.Listen("tcp", hostPort(nodeIP2, port))
	if err != nil {
		t.Skipf("port %d not free on %s: %v", port, nodeIP2, err)
	}
	defer holder.Close()
	nodePort := freePort(t, nodeIP, tcp)
	h := start(t, func(c *Config) {
		c.NodeIPs = []netip.Addr{netip.MustParseAddr(nodeIP), netip.MustParseAddr(nodeIP2)}
		c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix(nodeIP + "/32")}
	},
		service("web", corev1.ServiceTypeLoadBalancer, clusterIP, svcPort("http", tcp, port, nodePort)),
		slice("web", "web-a", tcp, "http", a.port, ready("127.0.0.1")),
	)
	waitServed(t, hostPort(nodeIP, port))
	waitServed(t, hostPort(nodeIP, nodePort))

	select {
	case ev := <-h.rec.Events:
		want := hostPort(nodeIP2, port) + "/TCP"
		if !strings.HasPrefix(ev, "Warning PortInUse") || !strings.Contains(ev, want) || !strings.Contains(ev, `"http"`) {
			t.Errorf("event %q does not name %s and port http", ev, want)
		}
		t.Logf("event: %s", ev)
	case <-time.After(5 * time.Second):
		t.Fatal("no Event for the taken port")
	}
	ingress := func() []string {
		s, err := h.client.CoreV1().Services(testNS).Get(context.Background(), "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, in := range s.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		return ips
	}
	// Only the node IP where the port could be opened is advertised.
	poll.Until(t, 10*time.Second, "ingress "+nodeIP, func() bool { return slices.Equal(ingress(), []string{nodeIP}) })
	// The retries log but send no second Event.
	time.Sleep(500 * time.Millisecond)
	select {
	case ev := <-h.rec.Events:
		t.Errorf("second event while retrying: %s", ev)
	default:
	}

	holder.Close()
	waitServed(t, hostPort(nodeIP2, port))
	poll.Until(t, 10*time.Second, "ingress of both node IPs", func() bool { return slices.Equal(ingress(), []string{nodeIP, nodeIP2}) })
	// The NodePort is restricted by NodePortAddresses.
	if _, err := ask(hostPort(nodeIP2, nodePort)); !refused(err) {
		t.Errorf("node port on %s: %v", nodeIP2, err)
	}

	// The status is patched only when it differs.
	patches := func() int {
		n := 0
		for _, a := range h.client.Actions() {
			if a.GetVerb() == "patch" && a.GetSubresource() == "status" {
				n++
			}
		}
		return n
	}
	before := patches()
	svc, err := h.client.CoreV1().Services(testNS).Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Annotations = map[string]string{"touched": "yes"}
	h.updateService(svc)
	time.Sleep(300 * time.Millisecond)
	if after := patches(); after != before {
		t.Errorf("status patched %d more times for an unchanged ingress", after-before)
	}
	for _, a := range h.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetSubresource() == "status" && !bytes.Contains(p.GetPatch(), []byte(`"ipMode":"VIP"`)) {
			t.Errorf("patch %s", p.GetPatch())
		}
	}
}

func TestLoadBalancerSourceRanges(t *testing.T) {
	a := tcpBackend(t, "a")
	u := udpBackend(t, "u")
	port := freePort(t, nodeIP, tcp)
	uport := freePort(t, nodeIP, udp)
	cport := freePort(t, clusterIP, tcp)
	svc := service("web", corev1.ServiceTypeLoadBalancer, clusterIP,
		svcPort("http", tcp, port, 0), svcPort("dns", udp, uport, 0))
	svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	svc.Spec.LoadBalancerSourceRanges = []string{"127.0.0.77/32"}
	h := start(t, nil, svc,
		slice("web", "web-a", tcp, "http", a.port, ready("127.0.0.1")),
		slice("web", "web-u", udp, "dns", u, ready("127.0.0.1")),
	)
	lb := hostPort(nodeIP, port)
	allowed := &net.TCPAddr{IP: net.ParseIP("127.0.0.77")}
	poll.Until(t, 10*time.Second, "LB serves 127.0.0.77", func() bool { n, err := askFrom(allowed, lb); return err == nil && n == "a" })
	// 127.0.0.1 is outside the range: connected, then reset, never served.
	if n, err := ask(lb); err == nil {
		t.Errorf("127.0.0.1 served by %q", n)
	}

	udpAsk := func(local string) error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(local)}, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(hostPort(nodeIP, uport))))
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("q")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		buf := make([]byte, 10)
		_, err = c.Read(buf)
		return err
	}
	poll.Until(t, 10*time.Second, "UDP LB answers 127.0.0.77", func() bool { return udpAsk("127.0.0.77") == nil })
	if err := udpAsk("127.0.0.1"); err == nil {
		t.Error("UDP from 127.0.0.1 answered")
	}

	// The ranges are for the load balancer: the ClusterIP serves anyone.
	svc.Spec.Ports = append(svc.Spec.Ports, svcPort("http2", tcp, cport, 0))
	h.updateService(svc)
	h.createSlice(slice("web", "web-a2", tcp, "http2", a.port, ready("127.0.0.1")))
	waitServed(t, hostPort(clusterIP, cport))
}

func TestRelaySplicesAndLeaksNothing(t *testing.T) {
	a := tcpBackend(t, "a")
	port := freePort(t, clusterIP, tcp)
	addr := hostPort(clusterIP, port)
	var mu sync.Mutex
	var relays int
	var wrongTypes []string
	h := startWith(t, nil, func(p *Proxy) {
		p.onRelay = func(client, backend net.Conn) {
			mu.Lock()
			defer mu.Unlock()
			relays++
			_, ok1 := client.(*net.TCPConn)
			_, ok2 := backend.(*net.TCPConn)
			if !ok1 || !ok2 {
				wrongTypes = append(wrongTypes, "client "+typeName(client)+", backend "+typeName(backend))
			}
		}
	},
		service("web", corev1.ServiceTypeClusterIP, clusterIP, svcPort("http", tcp, port, 0)),
		slice("web", "web-a", tcp, "http", a.port, ready("127.0.0.1")),
	)
	waitServed(t, addr)

	// Concurrent echoes of 1 MiB each, half-closing after the write: the
	// backend sees EOF, finishes echoing, and the client reads all of it.
	payload := make([]byte, 1<<20)
	_, _ = rand.Read(payload)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			r := bufio.NewReader(c)
			if _, err := r.ReadString('\n'); err != nil {
				errs <- err
				return
			}
			go func() {
				_, _ = c.Write(payload)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
			got, err := io.ReadAll(r)
			if err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, payload) {
				errs <- io.ErrShortBuffer
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("echo: %v", err)
	}
	mu.Lock()
	if relays < 9 || len(wrongTypes) > 0 {
		t.Errorf("%d relays; not *net.TCPConn: %v", relays, wrongTypes)
	}
	mu.Unlock()
	// Every relay is over: no per-connection goroutine is left.
	settledGoroutines(t)

	// A connection still open when the proxy stops is closed by it.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	h.stop()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); isTimeout(err) {
		t.Error("relayed connection still open after Run returned")
	}
}

func typeName(c net.Conn) string {
	switch c.(type) {
	case *net.TCPConn:
		return "*net.TCPConn"
	}
	return "other"
}

func TestReconcile(t *testing.T) {
	a := tcpBackend(t, "a")
	p1 := freePort(t, clusterIP, tcp)
	p2 := freePort(t, clusterIP, tcp)
	const otherIP = "127.0.0.51"
	p3 := freePort(t, otherIP, tcp)
	svc := service("web", corev1.ServiceTypeClusterIP, clusterIP, svcPort("one", tcp, p1, 0))
	h := start(t, nil, svc,
		slice("web", "web-a", tcp, "one", a.port, ready("127.0.0.1")),
	)
	waitServed(t, hostPort(clusterIP, p1))
	// An established connection through the first port.
	c, err := net.Dial("tcp", hostPort(clusterIP, p1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	echo := func(what string) {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, what+"\n"); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasSuffix(line, what+"\n") {
			t.Fatalf("%s: got %q, %v", what, line, err)
		}
	}
	if line, err := r.ReadString('\n'); err != nil || line != "a\n" {
		t.Fatalf("greeting %q, %v", line, err)
	}
	echo("first")

	// A second port: the first socket is kept as it is.
	svc.Spec.Ports = append(svc.Spec.Ports, svcPort("two", tcp, p2, 0))
	h.updateService(svc)
	s := slice("web", "web-a", tcp, "one", a.port, ready("127.0.0.1"))
	s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To("two"), Protocol: ptr.To(tcp), Port: ptr.To(a.port)})
	h.updateSlice(s)
	waitServed(t, hostPort(clusterIP, p2))
	echo("still there")
	mustAsk(t, hostPort(clusterIP, p1))

	// The ClusterIP changes: old addresses refuse, new ones serve, and the
	// established connection is left alone.
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = otherIP, []string{otherIP}
	svc.Spec.Ports[0].Port = p3
	h.updateService(svc)
	waitServed(t, hostPort(otherIP, p3))
	waitServed(t, hostPort(otherIP, p2))
	waitRefused(t, hostPort(clusterIP, p1))
	waitRefused(t, hostPort(clusterIP, p2))
	echo("after the move")

	// Deleted: refused.
	if err := h.client.CoreV1().Services(testNS).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRefused(t, hostPort(otherIP, p3))
	waitRefused(t, hostPort(otherIP, p2))
}

func TestRunTwice(t *testing.T) {
	h := start(t, nil)
	if err := h.p.Run(context.Background()); err == nil {
		t.Error("second Run did not fail")
	}
}

// default/kubernetes without endpoints (a loopback apiserver publishes
// none) is served by Config.APIServer; once its slices list one, they win.
func TestKubernetesServiceFallback(t *testing.T) {
	api, other := tcpBackend(t, "api"), tcpBackend(t, "other")
	port := freePort(t, clusterIP, tcp)
	svc := service("kubernetes", corev1.ServiceTypeClusterIP, clusterIP, svcPort("https", tcp, port, 0))
	svc.Namespace = metav1.NamespaceDefault
	h := start(t, func(c *Config) {
		c.APIServer = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(api.port))
	}, svc)
	if got, _ := waitServed(t, hostPort(clusterIP, port)); got != "api" {
		t.Fatalf("kubernetes Service without endpoints answered by %q, want the apiserver", got)
	}
	// Another Service without endpoints stays closed.
	port2 := freePort(t, clusterIP, tcp)
	web := service("web", corev1.ServiceTypeClusterIP, clusterIP, svcPort("http", tcp, port2, 0))
	if _, err := h.client.CoreV1().Services(web.Namespace).Create(context.Background(), web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := ask(hostPort(clusterIP, port2)); !refused(err) {
		t.Fatalf("a Service without endpoints answered: %v", err)
	}
	s := slice("kubernetes", "kubernetes", tcp, "https", other.port, ready("127.0.0.1"))
	s.Namespace = metav1.NamespaceDefault
	h.createSlice(s)
	poll.Until(t, 10*time.Second, "the slice's endpoint serves the kubernetes Service", func() bool {
		got, err := ask(hostPort(clusterIP, port))
		return err == nil && got == "other"
	})
}
