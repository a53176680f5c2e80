package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/netd/client"
	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/server"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// fakeKernel records every set the proxy sends; fail makes the next calls
// fail.
type fakeKernel struct {
	mu   sync.Mutex
	sets [][]KernelService
	fail int
}

func (k *fakeKernel) SetServices(_ context.Context, svcs []KernelService) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fail > 0 {
		k.fail--
		return errors.New("netd is restarting")
	}
	k.sets = append(k.sets, slices.Clone(svcs))
	return nil
}

func (k *fakeKernel) last() ([]KernelService, int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.sets) == 0 {
		return nil, 0
	}
	return k.sets[len(k.sets)-1], len(k.sets)
}

// render prints a set compactly for comparisons.
func render(set []KernelService) string {
	out := ""
	for _, s := range set {
		ext := ""
		for _, f := range []struct {
			set  bool
			name string
		}{{s.External, " external"}, {s.NodePort, " nodePort"}, {s.LoadBalancer, " loadBalancer"}, {s.Local, " local"}} {
			if f.set {
				ext += f.name
			}
		}
		out += fmt.Sprintf("%s %s:%d%s->%v; ", s.Protocol, s.IP, s.Port, ext, s.Endpoints)
	}
	return out
}

func (k *fakeKernel) waitFor(t *testing.T, want string) {
	t.Helper()
	poll.Until(t, 10*time.Second, "kernel set "+want, func() bool {
		set, _ := k.last()
		return render(set) == want
	})
}

const (
	podA = "100.64.0.5"
	podB = "100.64.0.6"
)

// TestKernelClusterIP: ClusterIPs of TCP and UDP go to the kernel with
// their ready endpoints, and no socket opens for them; a NodePort stays a
// socket of the relay while its ClusterIP is in the kernel; a Service with
// session affinity stays on the relay; changes and deletions follow.
func TestKernelClusterIP(t *testing.T) {
	k := &fakeKernel{}
	np := freePort(t, nodeIP, tcp)
	web := service("web", corev1.ServiceTypeNodePort, "10.43.0.20", svcPort("http", tcp, 80, np), svcPort("dns", udp, 53, 0))
	sticky := service("sticky", corev1.ServiceTypeClusterIP, clusterIP, svcPort("http", tcp, freePort(t, clusterIP, tcp), 0))
	sticky.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	notReady := ready(podB)
	notReady.Conditions.Ready = ptr.To(false)
	h := start(t, func(c *Config) { c.Kernel = k },
		web, sticky,
		slice("web", "web-1", tcp, "http", 8080, ready(podA), notReady),
		slice("web", "web-2", udp, "dns", 5353, ready(podA), ready(podB)),
		slice("sticky", "sticky-1", tcp, "http", 8080, ready(podA)),
	)
	if h.p.Mode() != "nftables" {
		t.Fatalf("mode %s", h.p.Mode())
	}
	k.waitFor(t, "UDP 10.43.0.20:53->[100.64.0.5:5353 100.64.0.6:5353]; TCP 10.43.0.20:80->[100.64.0.5:8080]; ")
	// The ClusterIP has no socket; the NodePort and the sticky Service do.
	poll.Until(t, 10*time.Second, "the NodePort and the sticky ClusterIP listen on the relay", func() bool {
		return listening(t, "tcp", netip.MustParseAddr(nodeIP), np) && listening(t, "tcp", netip.MustParseAddr(clusterIP), sticky.Spec.Ports[0].Port)
	})
	if listening(t, "tcp", netip.MustParseAddr("10.43.0.20"), 80) || listening(t, "udp", netip.MustParseAddr("10.43.0.20"), 53) {
		t.Fatal("the relay opened a socket on a ClusterIP the kernel serves")
	}

	// B becomes ready; then the UDP port loses every endpoint (refused in
	// the kernel, so it stays in the set with none).
	s := slice("web", "web-1", tcp, "http", 8080, ready(podA), ready(podB))
	changed := time.Now()
	h.updateSlice(s)
	h.deleteSlice("web-2")
	k.waitFor(t, "UDP 10.43.0.20:53->[]; TCP 10.43.0.20:80->[100.64.0.5:8080 100.64.0.6:8080]; ")
	// The bound for an endpoint change to reach the data path.
	if d := time.Since(changed); d > time.Second {
		t.Errorf("an endpoint change reached the kernel after %v, want within 1 s", d)
	} else {
		t.Logf("endpoint change → kernel set in %v (debounce %v)", d, DefaultKernelDebounce)
	}

	if err := h.client.CoreV1().Services(testNS).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.waitFor(t, "")
}

// externalIPs go to the kernel marked external, with the external policy's
// endpoints; one inside the pod range is not served (with a Warning
// Event); an externalIP that is another Service's ClusterIP and port
// loses to the ClusterIP, and two Services naming one externalIP and port
// resolve to the first by name, whatever order they synced in.
func TestKernelExternalIPs(t *testing.T) {
	k := &fakeKernel{}
	remote := ready(podB)
	remote.NodeName = ptr.To("node-b")
	web := service("web", corev1.ServiceTypeClusterIP, "10.43.0.20", svcPort("http", tcp, 80, 0))
	web.Spec.ExternalIPs = []string{"203.0.113.10", "100.64.0.9", "10.43.0.30"}
	web.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	other := service("other", corev1.ServiceTypeClusterIP, "10.43.0.30", svcPort("http", tcp, 80, 0))
	other.Spec.ExternalIPs = []string{"203.0.113.10"}
	h := start(t, func(c *Config) { c.Kernel = k; c.PodRanges = []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10")} },
		web, other,
		slice("web", "web-1", tcp, "http", 8080, ready(podA), remote),
		slice("other", "other-1", tcp, "http", 9090, ready(podB)),
	)
	k.waitFor(t, "TCP 10.43.0.20:80->[100.64.0.5:8080 100.64.0.6:8080]; "+
		"TCP 10.43.0.30:80->[100.64.0.6:9090]; "+
		"TCP 203.0.113.10:80 external->[100.64.0.6:9090]; ")
	poll.Until(t, 10*time.Second, "a Warning Event for the externalIP in the pod range", func() bool {
		select {
		case e := <-h.rec.Events:
			return strings.Contains(e, "ExternalIPRefused") && strings.Contains(e, "100.64.0.9")
		default:
			return false
		}
	})
	// "other" gone: web's externalIP is its own, with the Local policy's
	// endpoint only.
	if err := h.client.CoreV1().Services(testNS).Delete(context.Background(), "other", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.waitFor(t, "TCP 10.43.0.20:80->[100.64.0.5:8080 100.64.0.6:8080]; "+
		"TCP 10.43.0.30:80 external local->[100.64.0.5:8080]; "+
		"TCP 203.0.113.10:80 external local->[100.64.0.5:8080]; ")
	if listening(t, "tcp", netip.MustParseAddr("203.0.113.10"), 80) {
		t.Fatal("the relay opened a socket on an externalIP the kernel serves")
	}
}

// On the relay an externalIP is listened on only where it is the node's
// own address.
func TestRelayExternalIPOnlyOnNodeAddresses(t *testing.T) {
	b := tcpBackend(t, "b")
	port := freePort(t, "127.0.0.1", tcp)
	web := service("web", corev1.ServiceTypeClusterIP, clusterIP, svcPort("http", tcp, port, 0))
	web.Spec.ExternalIPs = []string{"127.0.0.1", "203.0.113.10"}
	start(t, func(c *Config) {
		c.LocalAddrs = func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil }
	}, web, slice("web", "web-1", tcp, "http", b.port, ready("127.0.0.1")))
	if name, _ := waitServed(t, hostPort("127.0.0.1", port)); name != "b" {
		t.Fatalf("the externalIP on the node's address served %q", name)
	}
	waitServed(t, hostPort(clusterIP, port))
	if listening(t, "tcp", netip.MustParseAddr("203.0.113.10"), port) {
		t.Fatal("the relay listens on an externalIP that is not the node's")
	}
}

// A burst of endpoint changes is one transaction, not one per change.
func TestKernelDebounce(t *testing.T) {
	k := &fakeKernel{}
	h := start(t, func(c *Config) { c.Kernel = k; c.KernelDebounce = 300 * time.Millisecond },
		service("web", corev1.ServiceTypeClusterIP, "10.43.0.20", svcPort("http", tcp, 80, 0)))
	k.waitFor(t, "TCP 10.43.0.20:80->[]; ")
	_, before := k.last()
	var eps []string
	for i := range 10 {
		ip := fmt.Sprintf("100.64.0.%d", 10+i)
		eps = append(eps, ip)
		h.createSlice(slice("web", "web-"+ip, tcp, "http", 8080, ready(ip)))
	}
	want := "TCP 10.43.0.20:80->["
	for i, ip := range eps {
		if i > 0 {
			want += " "
		}
		want += ip + ":8080"
	}
	k.waitFor(t, want+"]; ")
	if _, after := k.last(); after-before > 2 {
		t.Fatalf("10 endpoint changes in a burst took %d transactions, want 1 (2 at a debounce edge)", after-before)
	}
}

// A failing netd is retried until it takes the set; the set is sent
// again every resync although nothing changed.
func TestKernelRetryAndResync(t *testing.T) {
	k := &fakeKernel{fail: 2}
	start(t, func(c *Config) { c.Kernel = k; c.KernelResync = 300 * time.Millisecond },
		service("web", corev1.ServiceTypeClusterIP, "10.43.0.20", svcPort("http", tcp, 80, 0)),
		slice("web", "web-1", tcp, "http", 8080, ready(podA)))
	k.waitFor(t, "TCP 10.43.0.20:80->[100.64.0.5:8080]; ")
	poll.Until(t, 10*time.Second, "a resync resends the set", func() bool { _, n := k.last(); return n >= 3 })
}

// Only what the kernel can translate goes there: the kubernetes Service's
// loopback apiserver fallback stays on the relay; without a Kernel,
// nothing goes.
func TestInKernel(t *testing.T) {
	p := &Proxy{cfg: Config{Kernel: &fakeKernel{}, PodRanges: []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10")}}}
	ap := func(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
	cip := listenerKey{proto: tcp, addr: ap("10.43.0.1:443")}
	node := func(s string) listenerKey { return listenerKey{proto: tcp, addr: ap(s)} }
	pod := []netip.AddrPort{ap("100.64.0.5:8080")}
	for _, tc := range []struct {
		s    frontendSpec
		want bool
	}{
		{frontendSpec{key: cip, kind: kindClusterIP, endpoints: []netip.AddrPort{ap("100.64.0.5:6443")}}, true},
		{frontendSpec{key: cip, kind: kindClusterIP}, true},
		{frontendSpec{key: cip, kind: kindClusterIP, endpoints: []netip.AddrPort{ap("127.0.0.1:6443")}}, false},
		{frontendSpec{key: cip, kind: kindClusterIP, endpoints: []netip.AddrPort{ap("100.64.0.5:80"), ap("0.1.2.3:80")}}, false},
		{frontendSpec{key: cip, kind: kindClusterIP, endpoints: []netip.AddrPort{ap("224.0.0.5:80")}}, false},
		{frontendSpec{key: cip, kind: kindClusterIP, affinity: time.Hour}, false},
		// Node addresses: not loopback (the relay serves 127.0.0.1), with
		// endpoints (without, the relay's closed socket refuses), a node
		// port netd accepts, no source ranges or affinity (the relay's).
		{frontendSpec{key: node("192.168.1.5:30080"), kind: kindNodePort, endpoints: pod}, true},
		{frontendSpec{key: node("192.168.1.5:30080"), kind: kindNodePort, endpoints: pod, local: true}, true},
		{frontendSpec{key: node("192.168.1.5:443"), kind: kindLoadBalancer, endpoints: pod, local: true}, true},
		{frontendSpec{key: node("127.0.0.1:30080"), kind: kindNodePort, endpoints: pod}, false},
		{frontendSpec{key: node("127.0.0.1:443"), kind: kindLoadBalancer, endpoints: pod}, false},
		{frontendSpec{key: node("192.168.1.5:30080"), kind: kindNodePort}, false},
		{frontendSpec{key: node("192.168.1.5:443"), kind: kindLoadBalancer}, false},
		{frontendSpec{key: node("192.168.1.5:8080"), kind: kindNodePort, endpoints: pod}, false},
		{frontendSpec{key: node("192.168.1.5:443"), kind: kindLoadBalancer, endpoints: pod, allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, false},
		{frontendSpec{key: node("192.168.1.5:443"), kind: kindLoadBalancer, endpoints: pod, allow: []netip.Prefix{}}, false},
		{frontendSpec{key: node("192.168.1.5:30080"), kind: kindNodePort, endpoints: pod, affinity: time.Hour}, false},
		{frontendSpec{key: node("169.254.1.1:30080"), kind: kindNodePort, endpoints: pod}, false},
		// Local keeps the client's address only towards pods: a
		// hostNetwork endpoint (the node's address) stays on the relay.
		{frontendSpec{key: node("192.168.1.5:30080"), kind: kindNodePort, endpoints: []netip.AddrPort{ap("192.168.1.5:8080")}, local: true}, false},
		{frontendSpec{key: node("192.168.1.5:30080"), kind: kindNodePort, endpoints: []netip.AddrPort{ap("192.168.1.5:8080")}}, true},
		{frontendSpec{key: node("203.0.113.10:80"), kind: kindExternalIP, endpoints: []netip.AddrPort{ap("192.168.1.5:8080")}, local: true}, false},
		{frontendSpec{key: listenerKey{proto: tcp, addr: ap("203.0.113.10:80")}, kind: kindExternalIP, endpoints: []netip.AddrPort{ap("100.64.0.5:80")}}, true},
		{frontendSpec{key: listenerKey{proto: tcp, addr: ap("203.0.113.10:80")}, kind: kindExternalIP, affinity: time.Hour}, false},
		// What netd refuses for an external address stays out of the set.
		{frontendSpec{key: listenerKey{proto: tcp, addr: ap("169.254.169.254:80")}, kind: kindExternalIP}, false},
		{frontendSpec{key: listenerKey{proto: tcp, addr: ap("255.255.255.255:80")}, kind: kindExternalIP}, false},
		{frontendSpec{key: listenerKey{proto: tcp, addr: ap("127.0.0.1:80")}, kind: kindExternalIP}, false},
	} {
		if got := p.inKernel(tc.s); got != tc.want {
			t.Errorf("%+v: in kernel %v, want %v", tc.s, got, tc.want)
		}
	}
	if (&Proxy{}).inKernel(frontendSpec{key: cip, kind: kindClusterIP}) {
		t.Error("no Kernel, yet a ClusterIP went to it")
	}
}

// recordingDP is a netd dataplane that keeps the last Service set.
type recordingDP struct {
	dataplane.Dataplane
	mu   sync.Mutex
	last []dataplane.Service
	n    int
}

func (d *recordingDP) EnsureNode(dataplane.Node) error { return nil }
func (d *recordingDP) Inventory(dataplane.Node) (dataplane.Inventory, error) {
	return dataplane.Inventory{NodeReady: true}, nil
}
func (d *recordingDP) SetServices(_ dataplane.Node, svcs []dataplane.Service) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.last, d.n = svcs, d.n+1
	return nil
}

// recordedNetd starts a real netd server whose dataplane records what it
// is given, configured with ranges, and returns its client.
func recordedNetd(t *testing.T, ranges wire.ConfigureArgs) (*recordingDP, *client.Client) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "netd.sock")
	dp := &recordingDP{}
	srv, err := server.Start(server.Config{Socket: sock, StateFile: filepath.Join(dir, "state.json"), NetNSDir: filepath.Join(dir, "netns"),
		AllowedUID: os.Getuid(), NewDataplane: func() (dataplane.Dataplane, error) { return dp, nil },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	c := client.New(sock)
	if _, err := c.ConfigureRanges(context.Background(), ranges); err != nil {
		t.Fatal(err)
	}
	return dp, c
}

// NetdKernel through a real netd server (its dataplane recorded): 300
// Services of 5 endpoints, more than one frame, arrive whole.
func TestNetdKernel(t *testing.T) {
	dp, c := recordedNetd(t, wireRanges())
	var set []KernelService
	for i := range 300 {
		s := KernelService{Protocol: tcp, IP: netip.AddrFrom4([4]byte{10, 43, byte(i / 250), byte(i%250 + 1)}), Port: 80}
		if i%2 == 1 {
			s.Protocol = udp
		}
		for j := range 5 {
			s.Endpoints = append(s.Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, 64, 0, byte(j + 2)}), uint16(8000+j)))
		}
		set = append(set, s)
	}
	if err := (NetdKernel{Client: c}).SetServices(context.Background(), set); err != nil {
		t.Fatal(err)
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if dp.n != 1 || len(dp.last) != 300 {
		t.Fatalf("netd applied %d sets, the last of %d ports; want one of 300", dp.n, len(dp.last))
	}
	got := dp.last[299]
	if got.IP.String() != "10.43.1.50" || got.Protocol != dataplane.UDP || len(got.Endpoints) != 5 || got.Endpoints[4].String() != "100.64.0.6:8004" {
		t.Fatalf("last Service port arrived as %+v", got)
	}
}

// netd (a real server, its dataplane recorded) takes an address outside
// the Service range only marked external, and never a link-local one or
// one of the pod ranges, naming the field.
func TestNetdKernelExternalIPs(t *testing.T) {
	ranges := wireRanges()
	ranges.ClusterCIDR = "100.64.0.0/10"
	dp, c := recordedNetd(t, ranges)
	k := NetdKernel{Client: c}
	ep := []netip.AddrPort{netip.MustParseAddrPort("100.64.0.5:8080")}
	ext := func(ip string, external bool) []KernelService {
		return []KernelService{{Protocol: tcp, IP: netip.MustParseAddr(ip), Port: 80, External: external, Endpoints: ep}}
	}
	if err := k.SetServices(context.Background(), ext("203.0.113.10", true)); err != nil {
		t.Fatalf("an external IP marked external: %v", err)
	}
	dp.mu.Lock()
	if len(dp.last) != 1 || !dp.last[0].External || dp.last[0].IP.String() != "203.0.113.10" {
		t.Errorf("netd applied %+v", dp.last)
	}
	n := dp.n
	dp.mu.Unlock()
	for _, tc := range []struct {
		ip       string
		external bool
		want     string
	}{
		{"203.0.113.10", false, `ip 203.0.113.10 is outside the serviceCIDR 10.43.0.0/16; only an address of spec.externalIPs may be, sent with "external": true`},
		{"169.254.169.254", true, "ip 169.254.169.254 (external) is inside the reserved 169.254.0.0/16"},
		{"127.0.0.1", true, "ip 127.0.0.1 is inside the reserved 127.0.0.0/8"},
		{"224.0.0.1", true, "ip 224.0.0.1 is inside the reserved 224.0.0.0/4"},
		{"100.64.0.7", true, "ip 100.64.0.7 is inside the podCIDR 100.64.0.0/24"},
		{"100.65.0.7", true, "ip 100.65.0.7 is inside the clusterCIDR 100.64.0.0/10"},
	} {
		err := k.SetServices(context.Background(), ext(tc.ip, tc.external))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s (external %v): %v, want an error saying %q", tc.ip, tc.external, err, tc.want)
		}
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if dp.n != n {
		t.Errorf("a refused set reached the dataplane (%d sets, want %d)", dp.n, n)
	}
}

// listening reports whether this process has a socket bound to ip:port
// ("tcp": listening; "udp": bound), from /proc/self/net.
func listening(t *testing.T, proto string, ip netip.Addr, port int32) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/net/" + proto)
	if err != nil {
		t.Skipf("no /proc/self/net/%s: %v", proto, err)
	}
	a := ip.As4()
	// The kernel prints the address as the host-order value of the
	// network-order word (little-endian here), then the port in hex.
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", a[3], a[2], a[1], a[0], port)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && f[1] == want && (proto == "udp" || f[3] == "0A") {
			return true
		}
	}
	return false
}

func wireRanges() wire.ConfigureArgs {
	return wire.ConfigureArgs{PodCIDR: "100.64.0.0/24", ServiceCIDR: "10.43.0.0/16"}
}

// TestKernelNodeAddresses runs in a network namespace of its own (the
// test binary re-executed under unshare), where the node has a
// non-loopback address: NodePort and LoadBalancer frontends on it go to
// the kernel (local for externalTrafficPolicy: Local) once the relay holds
// their port; a port another process holds gets a PortInUse Event and
// stays out of the kernel and the ingress until it is free;
// loadBalancerSourceRanges stay on the relay; Local without a local
// endpoint is neither in the kernel nor listened on (refused).
func TestKernelNodeAddresses(t *testing.T) {
	if os.Getenv("K3SM_PROXY_NETNS_CHILD") == "" {
		if os.Geteuid() != 0 {
			t.Skip("needs root for a network namespace")
		}
		cmd := exec.Command("unshare", "--net", os.Args[0], "-test.run", "^TestKernelNodeAddresses$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "K3SM_PROXY_NETNS_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("in a new network namespace: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "--- PASS: TestKernelNodeAddresses") {
			t.Fatalf("child did not run the test:\n%s", out)
		}
		return
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"link", "add", "up0", "type", "veth", "peer", "name", "up0p"},
		{"addr", "add", "192.0.2.1/24", "dev", "up0"}, {"link", "set", "up0", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	const node = "192.0.2.1"
	holder, err := net.Listen("tcp", node+":9443")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	remote := ready(podB)
	remote.NodeName = ptr.To("node-b")
	local := service("local", corev1.ServiceTypeNodePort, "10.43.0.20", svcPort("http", tcp, 80, 30080))
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	lonely := service("lonely", corev1.ServiceTypeNodePort, "10.43.0.24", svcPort("http", tcp, 80, 30084))
	lonely.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	ranged := service("ranged", corev1.ServiceTypeLoadBalancer, "10.43.0.23", svcPort("http", tcp, 7443, 30083))
	ranged.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8"}
	k := &fakeKernel{}
	h := start(t, func(c *Config) {
		c.Kernel = k
		c.NodeIPs = []netip.Addr{netip.MustParseAddr(node)}
		c.PodRanges = []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10")}
	},
		local, lonely, ranged,
		service("lb", corev1.ServiceTypeLoadBalancer, "10.43.0.21", svcPort("http", tcp, 8443, 30081)),
		service("taken", corev1.ServiceTypeLoadBalancer, "10.43.0.22", svcPort("http", tcp, 9443, 30082)),
		slice("local", "local-1", tcp, "http", 8080, ready(podA), remote),
		slice("lonely", "lonely-1", tcp, "http", 8080, remote),
		slice("lb", "lb-1", tcp, "http", 8080, ready(podA)),
		slice("taken", "taken-1", tcp, "http", 8080, ready(podA)),
		slice("ranged", "ranged-1", tcp, "http", 8080, ready(podA)),
	)
	clusterIPs := "TCP 10.43.0.20:80->[100.64.0.5:8080 100.64.0.6:8080]; TCP 10.43.0.21:8443->[100.64.0.5:8080]; " +
		"TCP 10.43.0.22:9443->[100.64.0.5:8080]; TCP 10.43.0.23:7443->[100.64.0.5:8080]; TCP 10.43.0.24:80->[100.64.0.6:8080]; "
	onNode := "TCP 192.0.2.1:8443 loadBalancer->[100.64.0.5:8080]; TCP 192.0.2.1:30080 nodePort local->[100.64.0.5:8080]; " +
		"TCP 192.0.2.1:30081 nodePort->[100.64.0.5:8080]; TCP 192.0.2.1:30082 nodePort->[100.64.0.5:8080]; " +
		"TCP 192.0.2.1:30083 nodePort->[100.64.0.5:8080]; "
	k.waitFor(t, clusterIPs+onNode)
	ip := netip.MustParseAddr(node)
	for port, want := range map[int32]bool{30080: true, 8443: true, 7443: true, 30084: false} {
		if got := listening(t, "tcp", ip, port); got != want {
			t.Errorf("relay socket on %s:%d: %v, want %v", node, port, got, want)
		}
	}
	poll.Until(t, 10*time.Second, "a PortInUse Event for "+node+":9443", func() bool {
		select {
		case e := <-h.rec.Events:
			return strings.HasPrefix(e, "Warning PortInUse") && strings.Contains(e, node+":9443/TCP")
		default:
			return false
		}
	})
	ingress := func(name string) string {
		s, err := h.client.CoreV1().Services(testNS).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, in := range s.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		return strings.Join(ips, ",")
	}
	poll.Until(t, 10*time.Second, "ingress of lb the node's address, of taken none", func() bool {
		return ingress("lb") == node && ingress("taken") == ""
	})
	// Freed, the port is the relay's, then the kernel's.
	holder.Close()
	k.waitFor(t, clusterIPs+"TCP 192.0.2.1:8443 loadBalancer->[100.64.0.5:8080]; TCP 192.0.2.1:9443 loadBalancer->[100.64.0.5:8080]; "+
		onNode[len("TCP 192.0.2.1:8443 loadBalancer->[100.64.0.5:8080]; "):])
}

// netd (a real server, its dataplane recorded) takes a nodePort and a
// load-balancer ingress on a node address outside the Service range, with
// Local, and refuses a node port outside 30000-32767 and a Local endpoint
// that is not a pod of the node.
func TestNetdKernelNodePorts(t *testing.T) {
	dp, c := recordedNetd(t, wireRanges())
	k := NetdKernel{Client: c}
	node := netip.MustParseAddr("192.168.1.5")
	ep := []netip.AddrPort{netip.MustParseAddrPort("100.64.0.5:8080")}
	if err := k.SetServices(context.Background(), []KernelService{
		{Protocol: tcp, IP: node, Port: 443, LoadBalancer: true, Endpoints: ep},
		{Protocol: tcp, IP: node, Port: 30080, NodePort: true, Local: true, Endpoints: ep},
	}); err != nil {
		t.Fatal(err)
	}
	dp.mu.Lock()
	if len(dp.last) != 2 || !dp.last[0].OnNode || dp.last[0].Local || !dp.last[1].OnNode || !dp.last[1].Local || dp.last[1].External {
		t.Errorf("netd applied %+v", dp.last)
	}
	n := dp.n
	dp.mu.Unlock()
	for _, tc := range []struct {
		s    KernelService
		want string
	}{
		{KernelService{Protocol: tcp, IP: node, Port: 8080, NodePort: true, Endpoints: ep}, "node port 8080 is outside the node port range 30000-32767"},
		{KernelService{Protocol: tcp, IP: node, Port: 30080, NodePort: true, Local: true, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("192.168.1.5:8080")}},
			"endpoint 192.168.1.5 is outside the podCIDR 100.64.0.0/24"},
		{KernelService{Protocol: tcp, IP: netip.MustParseAddr("10.43.0.5"), Port: 80, Local: true, Endpoints: ep}, "applies only to an external, nodePort or loadBalancer address"},
	} {
		if err := k.SetServices(context.Background(), []KernelService{tc.s}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error saying %q", tc.s, err, tc.want)
		}
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if dp.n != n {
		t.Errorf("a refused set reached the dataplane (%d sets, want %d)", dp.n, n)
	}
}
