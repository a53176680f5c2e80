package proxy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

var (
	testNodeIPs = []netip.Addr{netip.MustParseAddr(nodeIP)}
)

func keys(specs []frontendSpec) []string {
	var out []string
	for _, s := range specs {
		out = append(out, s.kind.String()+" "+s.key.String())
	}
	slices.Sort(out)
	return out
}

func TestDesiredFrontendsSkips(t *testing.T) {
	ep := []*discoveryv1.EndpointSlice{slice("s", "s-1", tcp, "", 8080, ready("100.64.0.5"))}
	headless := service("s", corev1.ServiceTypeClusterIP, corev1.ClusterIPNone, svcPort("", tcp, 80, 0))
	external := service("s", corev1.ServiceTypeExternalName, "", svcPort("", tcp, 80, 0))
	external.Spec.ExternalName = "example.invalid"
	other := service("s", corev1.ServiceTypeClusterIP, "10.43.0.10", svcPort("", tcp, 80, 0))
	other.Labels = map[string]string{labelProxyName: "someone-else"}
	for _, svc := range []*corev1.Service{headless, external, other} {
		if got := desiredFrontends(svc, ep, testNode, testNodeIPs, testNodeIPs); len(got) != 0 {
			t.Errorf("%s/%v: %v", svc.Spec.Type, svc.Labels, keys(got))
		}
	}
}

func TestDesiredFrontendsAddresses(t *testing.T) {
	svc := service("s", corev1.ServiceTypeLoadBalancer, "10.43.0.10",
		svcPort("http", tcp, 80, 30080), svcPort("dns", udp, 53, 30053), corev1.ServicePort{Name: "x", Protocol: corev1.ProtocolSCTP, Port: 9})
	svc.Spec.ClusterIPs = []string{"10.43.0.10", "fd00::10"} // the IPv6 family is not served
	eps := []*discoveryv1.EndpointSlice{
		slice("s", "s-http", tcp, "http", 8080, ready("100.64.0.5")),
		slice("s", "s-dns", udp, "dns", 5353, ready("100.64.0.5")),
	}
	got := keys(desiredFrontends(svc, eps, testNode, testNodeIPs, testNodeIPs))
	want := []string{
		"ClusterIP 10.43.0.10:53/UDP", "ClusterIP 10.43.0.10:80/TCP",
		"LoadBalancer 127.0.0.60:53/UDP", "LoadBalancer 127.0.0.60:80/TCP",
		"NodePort 127.0.0.60:30053/UDP", "NodePort 127.0.0.60:30080/TCP",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	for _, s := range desiredFrontends(svc, eps, testNode, testNodeIPs, testNodeIPs) {
		wantEP := "100.64.0.5:8080"
		if s.key.proto == udp {
			wantEP = "100.64.0.5:5353"
		}
		if len(s.endpoints) != 1 || s.endpoints[0].String() != wantEP {
			t.Errorf("%v: endpoints %v", s.key, s.endpoints)
		}
	}

	// Another load balancer implementation: no LoadBalancer sockets.
	svc.Spec.LoadBalancerClass = ptr.To("example.com/lb")
	got = keys(desiredFrontends(svc, eps, testNode, testNodeIPs, testNodeIPs))
	if slices.ContainsFunc(got, func(s string) bool { return s[:3] == "Loa" }) || len(got) != 4 {
		t.Errorf("with a loadBalancerClass: %v", got)
	}
	// No node ports allocated: none opened.
	svc.Spec.LoadBalancerClass = nil
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = 0
	}
	got = keys(desiredFrontends(svc, eps, testNode, testNodeIPs, nil))
	if len(got) != 4 || slices.ContainsFunc(got, func(s string) bool { return s[:3] == "Nod" }) {
		t.Errorf("without node ports: %v", got)
	}
}

func TestEndpointsForMatchesPortAndMerges(t *testing.T) {
	sp := svcPort("http", tcp, 80, 0)
	wrongName := slice("s", "s-1", tcp, "metrics", 9090, ready("100.64.0.1"))
	wrongProto := slice("s", "s-2", udp, "http", 8080, ready("100.64.0.2"))
	v6 := slice("s", "s-3", tcp, "http", 8080, ready("fd00::3"))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	notReady := ready("100.64.0.4")
	notReady.Conditions.Ready = ptr.To(false)
	// The same endpoint in two slices (a move between slices): ready wins.
	a := slice("s", "s-4", tcp, "http", 8080, notReady, discoveryv1.Endpoint{Addresses: []string{"100.64.0.5"}})
	b := slice("s", "s-5", tcp, "http", 8080, ready("100.64.0.4"))
	b.Ports[0].Protocol = nil // defaults to TCP
	got := endpointsFor(sp, []*discoveryv1.EndpointSlice{wrongName, wrongProto, v6, a, b}, testNode)
	if len(got) != 2 || got[0].addr.String() != "100.64.0.4:8080" || !got[0].ready || !got[0].local ||
		got[1].addr.String() != "100.64.0.5:8080" || !got[1].ready || got[1].local {
		t.Errorf("got %+v", got)
	}
}

func TestChoose(t *testing.T) {
	ep := func(ip string, ready, serving, terminating, local bool) endpoint {
		return endpoint{addr: netip.MustParseAddrPort(ip + ":80"), ready: ready, serving: serving, terminating: terminating, local: local}
	}
	eps := []endpoint{
		ep("100.64.0.1", true, true, false, false),
		ep("100.64.0.2", false, true, true, true),
		ep("100.64.0.3", false, false, true, true),
	}
	str := func(a []netip.AddrPort) []string {
		var out []string
		for _, x := range a {
			out = append(out, x.Addr().String())
		}
		return out
	}
	if got := str(choose(eps, false)); !slices.Equal(got, []string{"100.64.0.1"}) {
		t.Errorf("cluster: %v", got)
	}
	// Local: no local endpoint is ready, so the serving terminating one.
	if got := str(choose(eps, true)); !slices.Equal(got, []string{"100.64.0.2"}) {
		t.Errorf("local: %v", got)
	}
	if got := choose(eps[2:], false); len(got) != 0 {
		t.Errorf("not serving: %v", got)
	}
}

func TestSourceRanges(t *testing.T) {
	svc := service("s", corev1.ServiceTypeLoadBalancer, "10.43.0.10")
	if got := sourceRanges(svc); got != nil {
		t.Errorf("none: %v", got)
	}
	svc.Annotations = map[string]string{annSourceRanges: "10.0.0.0/8, 192.168.1.7/24"}
	if got := sourceRanges(svc); len(got) != 2 || got[1].String() != "192.168.1.0/24" {
		t.Errorf("annotation: %v", got)
	}
	// The field wins; a list with nothing usable admits nobody.
	svc.Spec.LoadBalancerSourceRanges = []string{"bogus"}
	if got := sourceRanges(svc); got == nil || len(got) != 0 {
		t.Errorf("bogus: %#v", got)
	}
}

func TestNewNodePortAddresses(t *testing.T) {
	p, err := New(Config{
		Client:            fakeClient(),
		NodeName:          testNode,
		NodeIPs:           []netip.Addr{netip.MustParseAddr("127.0.0.61"), netip.MustParseAddr(nodeIP), netip.MustParseAddr(nodeIP)},
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.60/32")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.nodePortIPs; len(got) != 1 || got[0].String() != nodeIP {
		t.Errorf("node port IPs %v", got)
	}
	if len(p.cfg.NodeIPs) != 2 {
		t.Errorf("node IPs %v", p.cfg.NodeIPs)
	}
	if _, err := New(Config{Client: fakeClient(), NodeName: testNode, NodeIPs: []netip.Addr{{}}}); err == nil {
		t.Error("invalid node IP accepted")
	}
	if _, err := New(Config{NodeName: testNode}); err == nil {
		t.Error("no client accepted")
	}
}

func TestSameIngress(t *testing.T) {
	ips := []netip.Addr{netip.MustParseAddr("127.0.0.60"), netip.MustParseAddr("127.0.0.61")}
	have := []corev1.LoadBalancerIngress{{IP: "127.0.0.61"}, {IP: "127.0.0.60", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
	if !sameIngress(have, ips) {
		t.Error("same IPs in another order differ")
	}
	if sameIngress(have[:1], ips) || sameIngress([]corev1.LoadBalancerIngress{{IP: "127.0.0.60"}, {Hostname: "lb"}}, ips) {
		t.Error("different ingress is the same")
	}
}

// externalIPs are served on the Service's ports, with the external
// traffic policy (Local: this node's endpoints only), on any Service type;
// IPv6 entries and repeats are dropped.
func TestDesiredFrontendsExternalIPs(t *testing.T) {
	remote := ready("100.64.0.6")
	remote.NodeName = ptr.To("node-b")
	eps := []*discoveryv1.EndpointSlice{
		slice("s", "s-http", tcp, "http", 8080, ready("100.64.0.5"), remote),
		slice("s", "s-dns", udp, "dns", 5353, ready("100.64.0.5"), remote),
	}
	svc := service("s", corev1.ServiceTypeClusterIP, "10.43.0.10", svcPort("http", tcp, 80, 0), svcPort("dns", udp, 53, 0))
	svc.Spec.ExternalIPs = []string{"203.0.113.10", "fd00::10", "203.0.113.10", "198.51.100.7"}
	// The ClusterIP keeps the internal policy whatever the external one is.
	svc.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	got := desiredFrontends(svc, eps, testNode, testNodeIPs, testNodeIPs)
	want := []string{
		"ClusterIP 10.43.0.10:53/UDP", "ClusterIP 10.43.0.10:80/TCP",
		"ExternalIP 198.51.100.7:53/UDP", "ExternalIP 198.51.100.7:80/TCP",
		"ExternalIP 203.0.113.10:53/UDP", "ExternalIP 203.0.113.10:80/TCP",
	}
	if k := keys(got); !slices.Equal(k, want) {
		t.Fatalf("got %v\nwant %v", k, want)
	}
	endpoints := func(specs []frontendSpec) map[string]int {
		out := map[string]int{}
		for _, s := range specs {
			out[s.kind.String()+" "+s.key.String()] = len(s.endpoints)
		}
		return out
	}
	for k, n := range endpoints(got) {
		if want := map[bool]int{true: 1, false: 2}[k[:3] == "Clu"]; n != want {
			t.Errorf("externalTrafficPolicy Cluster: %s has %d endpoints, want %d", k, n, want)
		}
	}
	svc.Spec.InternalTrafficPolicy = nil
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	for k, n := range endpoints(desiredFrontends(svc, eps, testNode, testNodeIPs, testNodeIPs)) {
		if want := map[bool]int{true: 2, false: 1}[k[:3] == "Clu"]; n != want {
			t.Errorf("externalTrafficPolicy Local: %s has %d endpoints, want %d", k, n, want)
		}
	}
	// A NodePort Service's externalIPs take its ports, not its node ports.
	np := service("s", corev1.ServiceTypeNodePort, "10.43.0.10", svcPort("http", tcp, 80, 30080))
	np.Spec.ExternalIPs = []string{"203.0.113.10"}
	if k := keys(desiredFrontends(np, eps, testNode, testNodeIPs, testNodeIPs)); !slices.Contains(k, "ExternalIP 203.0.113.10:80/TCP") || len(k) != 3 {
		t.Errorf("NodePort with an externalIP: %v", k)
	}
}

// externalTrafficPolicy marks the NodePort, LoadBalancer and externalIP
// frontends local (the kernel keeps the client's address for them), never
// the ClusterIP, and gives them only this node's endpoints; Cluster marks
// none.
func TestDesiredFrontendsLocal(t *testing.T) {
	remote := ready("100.64.0.6")
	remote.NodeName = ptr.To("node-b")
	eps := []*discoveryv1.EndpointSlice{slice("s", "s-http", tcp, "http", 8080, ready("100.64.0.5"), remote)}
	svc := service("s", corev1.ServiceTypeLoadBalancer, "10.43.0.10", svcPort("http", tcp, 80, 30080))
	svc.Spec.ExternalIPs = []string{"203.0.113.10"}
	nodeIPs := []netip.Addr{netip.MustParseAddr("192.168.1.5"), netip.MustParseAddr("127.0.0.1")}
	got := func() map[string]string {
		out := map[string]string{}
		for _, f := range desiredFrontends(svc, eps, testNode, nodeIPs, nodeIPs) {
			out[f.kind.String()+" "+f.key.String()] = fmt.Sprintf("local=%v %v", f.local, f.endpoints)
		}
		return out
	}
	both, one := "[100.64.0.5:8080 100.64.0.6:8080]", "[100.64.0.5:8080]"
	want := map[string]string{
		"ClusterIP 10.43.0.10:80/TCP":     "local=false " + both,
		"NodePort 192.168.1.5:30080/TCP":  "local=false " + both,
		"NodePort 127.0.0.1:30080/TCP":    "local=false " + both,
		"LoadBalancer 192.168.1.5:80/TCP": "local=false " + both,
		"LoadBalancer 127.0.0.1:80/TCP":   "local=false " + both,
		"ExternalIP 203.0.113.10:80/TCP":  "local=false " + both,
	}
	if g := got(); !maps.Equal(g, want) {
		t.Fatalf("Cluster:\ngot  %v\nwant %v", g, want)
	}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	for k := range want {
		if !strings.HasPrefix(k, "ClusterIP") {
			want[k] = "local=true " + one
		}
	}
	if g := got(); !maps.Equal(g, want) {
		t.Fatalf("Local:\ngot  %v\nwant %v", g, want)
	}
	// No local endpoint: the external frontends have none (refused), the
	// ClusterIP keeps both.
	eps = []*discoveryv1.EndpointSlice{slice("s", "s-http", tcp, "http", 8080, remote)}
	for k, v := range got() {
		if wantEmpty := !strings.HasPrefix(k, "ClusterIP"); wantEmpty != strings.HasSuffix(v, "[]") {
			t.Errorf("Local without a local endpoint: %s %s", k, v)
		}
	}
}
