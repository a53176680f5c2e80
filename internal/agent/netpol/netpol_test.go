package netpol

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

const node = "n1"

type podOpt func(*corev1.Pod)

func onNode(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }
func port(name string, n int32, proto corev1.Protocol) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{Name: name, ContainerPort: n, Protocol: proto})
	}
}

func mkPod(ns, name, ip string, lbls map[string]string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), Labels: lbls},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
	if ip != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func mkNS(name string, lbls map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
}

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func mkNP(ns, name string, target *metav1.LabelSelector, f func(*networkingv1.NetworkPolicySpec)) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: networkingv1.NetworkPolicySpec{PodSelector: *target}}
	if f != nil {
		f(&np.Spec)
	}
	return np
}

func tcp(p intstr.IntOrString) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Port: &p}
}

func host(ip string) Peer { return Peer{CIDR: netip.PrefixFrom(netip.MustParseAddr(ip), 32)} }

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func run(pods []*corev1.Pod, nss []*corev1.Namespace, nps ...*networkingv1.NetworkPolicy) map[string]Policy {
	st := state{pods: pods, policies: nps, namespaces: map[string]labels.Set{}}
	for _, ns := range nss {
		st.namespaces[ns.Name] = labels.Set(ns.Labels)
	}
	return compute(node, st, nil)
}

func want(t *testing.T, got map[string]Policy, p *corev1.Pod, w Policy) {
	t.Helper()
	g, ok := got[string(p.UID)]
	if !ok {
		t.Fatalf("no policy computed for %s/%s", p.Namespace, p.Name)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s/%s:\n got %+v\nwant %+v", p.Namespace, p.Name, g, w)
	}
}

var namespaces = []*corev1.Namespace{mkNS("default", nil), mkNS("team-a", map[string]string{"team": "a"}), mkNS("team-b", map[string]string{"team": "b"})}

func TestPodAndNamespaceSelectors(t *testing.T) {
	web := mkPod("default", "web", "10.0.0.2", map[string]string{"app": "web"})
	other := mkPod("default", "other", "10.0.0.3", map[string]string{"app": "other"})
	client := mkPod("default", "client", "10.0.0.4", map[string]string{"role": "client"})
	clientA := mkPod("team-a", "client", "10.0.1.4", map[string]string{"role": "client"}, onNode("n2"))
	serverA := mkPod("team-a", "server", "10.0.1.5", map[string]string{"role": "server"}, onNode("n2"))
	clientB := mkPod("team-b", "client", "10.0.2.4", map[string]string{"role": "client"}, onNode("n2"))
	pods := []*corev1.Pod{web, other, client, clientA, serverA, clientB}

	from := func(peers ...networkingv1.NetworkPolicyPeer) *networkingv1.NetworkPolicy {
		return mkNP("default", "p", sel("app", "web"), func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: peers}}
		})
	}
	isolated := func(peers ...Peer) Policy {
		return Policy{Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: peers}}}}
	}
	// podSelector alone: the policy's namespace only.
	got := run(pods, namespaces, from(networkingv1.NetworkPolicyPeer{PodSelector: sel("role", "client")}))
	want(t, got, web, isolated(host("10.0.0.4")))
	want(t, got, other, Policy{})
	want(t, got, client, Policy{})
	if _, ok := got[string(clientA.UID)]; ok {
		t.Error("a pod of another node got a policy")
	}
	// namespaceSelector alone: every pod there.
	got = run(pods, namespaces, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "a")}))
	want(t, got, web, isolated(Peer{CIDR: pfx("10.0.1.4/31")}))
	// Both: the pods matching in the namespaces matching.
	got = run(pods, namespaces, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: sel("role", "client")}))
	want(t, got, web, isolated(host("10.0.0.4"), host("10.0.1.4"), host("10.0.2.4")))
	got = run(pods, namespaces, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "b"), PodSelector: sel("role", "client")}))
	want(t, got, web, isolated(host("10.0.2.4")))
	// A selector matching nothing allows nothing (not "any").
	got = run(pods, namespaces, from(networkingv1.NetworkPolicyPeer{PodSelector: sel("role", "none")}))
	want(t, got, web, Policy{Ingress: Direction{Isolated: true}})
	// An empty podSelector in the policy selects every pod of its namespace.
	got = run(pods, namespaces, mkNP("default", "all", &metav1.LabelSelector{}, nil))
	for _, p := range []*corev1.Pod{web, other, client} {
		want(t, got, p, Policy{Ingress: Direction{Isolated: true}})
	}
}

func TestIPBlock(t *testing.T) {
	web := mkPod("default", "web", "10.0.0.2", map[string]string{"app": "web"})
	np := mkNP("default", "p", sel("app", "web"), func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16", Except: []string{"192.168.1.0/24", "fd00::/64", "10.0.0.0/8"}}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/8"}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "172.16.0.1/12"}},
		}}}
	})
	want(t, run([]*corev1.Pod{web}, namespaces, np), web, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{
		{CIDR: pfx("192.168.0.0/16"), Except: []netip.Prefix{pfx("192.168.1.0/24")}},
		{CIDR: pfx("172.16.0.0/12")},
	}}}}})
	// Only IPv6: the rule matches nothing.
	np.Spec.Ingress[0].From = np.Spec.Ingress[0].From[1:2]
	want(t, run([]*corev1.Pod{web}, namespaces, np), web, Policy{Ingress: Direction{Isolated: true}})
}

func TestPortsAndNamedPorts(t *testing.T) {
	web := mkPod("default", "web", "10.0.0.2", map[string]string{"app": "web"}, port("http", 8080, ""), port("dns", 5353, corev1.ProtocolUDP))
	db := mkPod("default", "db", "10.0.0.3", map[string]string{"app": "db"}, port("sql", 5432, ""))
	cache := mkPod("default", "cache", "10.0.0.4", map[string]string{"app": "db"}, port("sql", 6379, ""), onNode("n2"))
	nosql := mkPod("default", "nosql", "10.0.0.5", map[string]string{"app": "db"}, onNode("n2"))
	pods := []*corev1.Pod{web, db, cache, nosql}
	udp, sctp := corev1.ProtocolUDP, corev1.ProtocolSCTP

	ing := mkNP("default", "in", sel("app", "web"), func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{
			{Ports: []networkingv1.NetworkPolicyPort{
				tcp(intstr.FromInt32(80)),
				{Protocol: &udp, Port: ptr.To(intstr.FromInt32(1000)), EndPort: ptr.To[int32](2000)},
				{Protocol: &sctp},
				tcp(intstr.FromString("http")),
				{Protocol: &udp, Port: ptr.To(intstr.FromString("dns"))},
				{Protocol: &udp, Port: ptr.To(intstr.FromString("http"))}, // http is TCP: nothing
			}},
			// Only a name the pod does not have: the rule allows nothing.
			{Ports: []networkingv1.NetworkPolicyPort{tcp(intstr.FromString("metrics"))}},
		}
	})
	want(t, run(pods, namespaces, ing), web, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{{Ports: []Port{
		{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 1000, EndPort: 2000}, {Protocol: "SCTP"},
		{Protocol: "TCP", Port: 8080}, {Protocol: "UDP", Port: 5353},
	}}}}})

	// Egress to a named port: its number on each peer that has it.
	eg := mkNP("default", "out", sel("app", "web"), func(s *networkingv1.NetworkPolicySpec) {
		s.Egress = []networkingv1.NetworkPolicyEgressRule{
			{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "db")}}, Ports: []networkingv1.NetworkPolicyPort{tcp(intstr.FromString("sql")), tcp(intstr.FromInt32(22))}},
			{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: ptr.To(intstr.FromString("dns"))}}},
		}
	})
	want(t, run(pods, namespaces, eg), web, Policy{
		Ingress: Direction{Isolated: true},
		Egress: Direction{Isolated: true, Rules: []Rule{
			{Peers: []Peer{{CIDR: pfx("10.0.0.3/32")}, {CIDR: pfx("10.0.0.4/31")}}, Ports: []Port{{Protocol: "TCP", Port: 22}}},
			{Peers: []Peer{host("10.0.0.3")}, Ports: []Port{{Protocol: "TCP", Port: 5432}}},
			{Peers: []Peer{host("10.0.0.4")}, Ports: []Port{{Protocol: "TCP", Port: 6379}}},
			// No peers: any pod with the name, here web itself.
			{Peers: []Peer{host("10.0.0.2")}, Ports: []Port{{Protocol: "UDP", Port: 5353}}},
		}},
	})
}

func TestPolicyTypesAndUnion(t *testing.T) {
	web := mkPod("default", "web", "10.0.0.2", map[string]string{"app": "web"})
	a := mkPod("default", "a", "10.0.0.10", map[string]string{"role": "a"})
	b := mkPod("default", "b", "10.0.0.11", map[string]string{"role": "b"})
	pods := []*corev1.Pod{web, a, b}
	ruleFrom := func(role string) networkingv1.NetworkPolicyIngressRule {
		return networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("role", role)}}}
	}
	egressOnly := mkNP("default", "e", sel("app", "web"), func(s *networkingv1.NetworkPolicySpec) {
		s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{ruleFrom("a")} // ignored: not its type
	})
	want(t, run(pods, namespaces, egressOnly), web, Policy{Egress: Direction{Isolated: true}})
	// Default types: ingress, and egress since it has egress rules.
	both := mkNP("default", "both", sel("app", "web"), func(s *networkingv1.NetworkPolicySpec) {
		s.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
	})
	want(t, run(pods, namespaces, both), web, Policy{Ingress: Direction{Isolated: true}, Egress: Direction{Isolated: true, Rules: []Rule{{}}}})
	// Two policies: the union of their rules.
	pa := mkNP("default", "pa", sel("app", "web"), func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{ruleFrom("a")}
	})
	pb := mkNP("default", "pb", sel("app", "web"), func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{ruleFrom("b")}
	})
	want(t, run(pods, namespaces, pb, pa), web, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{
		{Peers: []Peer{host("10.0.0.10")}}, {Peers: []Peer{host("10.0.0.11")}},
	}}})
	// An allow-all rule makes the others moot.
	all := mkNP("default", "all", sel("app", "web"), func(s *networkingv1.NetworkPolicySpec) { s.Ingress = []networkingv1.NetworkPolicyIngressRule{{}} })
	want(t, run(pods, namespaces, pa, all), web, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{{}}}})
	// A policy of another namespace does not select.
	want(t, run(pods, namespaces, mkNP("team-a", "x", &metav1.LabelSelector{}, nil)), web, Policy{})
}

func TestPodsThatGetNoPolicy(t *testing.T) {
	hostNet := mkPod("default", "h", "192.168.0.1", nil, func(p *corev1.Pod) { p.Spec.HostNetwork = true })
	pending := mkPod("default", "pending", "", nil)
	done := mkPod("default", "done", "10.0.0.9", map[string]string{"role": "a"}, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })
	web := mkPod("default", "web", "10.0.0.2", map[string]string{"app": "web"})
	np := mkNP("default", "p", &metav1.LabelSelector{}, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}}
	})
	got := run([]*corev1.Pod{hostNet, pending, done, web}, namespaces, np)
	if len(got) != 1 {
		t.Fatalf("policies for %d pods, want only web's: %v", len(got), got)
	}
	// Neither the finished pod nor the hostNetwork one is a peer.
	want(t, got, web, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{host("10.0.0.2")}}}}})
}

func TestCollapse(t *testing.T) {
	var addrs []netip.Addr
	for _, s := range []string{"10.0.0.9", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7", "10.0.0.8", "10.0.0.4", "10.0.0.20"} {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	got := collapse(addrs)
	w := []netip.Prefix{pfx("10.0.0.2/31"), pfx("10.0.0.4/30"), pfx("10.0.0.8/31"), pfx("10.0.0.20/32")}
	if !reflect.DeepEqual(got, w) {
		t.Errorf("collapse = %v, want %v", got, w)
	}
	if got := rangePrefixes(0, ^uint32(0)); len(got) != 1 || got[0] != pfx("0.0.0.0/0") {
		t.Errorf("whole range = %v", got)
	}
}

// recorder is an Applier that keeps what it was sent.
type recorder struct {
	mu    sync.Mutex
	calls map[string]int
	last  map[string]Policy
	fail  map[string]error
}

func (r *recorder) SetPolicy(_ context.Context, uid string, p Policy) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fail[uid]; err != nil {
		return err
	}
	r.calls[uid]++
	r.last[uid] = p
	return nil
}

func (r *recorder) get(uid types.UID) (Policy, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[string(uid)], r.calls[string(uid)]
}

// TestController: policies follow pods and policies as they come and go,
// each change is sent once, a failed apply is retried, and the full
// resync sends everything again.
func TestController(t *testing.T) {
	web := mkPod("default", "web", "10.0.0.2", map[string]string{"app": "web"})
	client := fake.NewClientset(web, mkNS("default", nil))
	rec := &recorder{calls: map[string]int{}, last: map[string]Policy{}, fail: map[string]error{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := New(Config{Client: client, NodeName: node, Applier: rec, Debounce: 10 * time.Millisecond, Resync: time.Hour})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	poll.Until(t, 10*time.Second, "web's first policy", func() bool { _, n := rec.get(web.UID); return n == 1 })
	np := mkNP("default", "p", sel("app", "web"), func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("role", "client")}}}}
	})
	if _, err := client.NetworkingV1().NetworkPolicies("default").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "isolation", func() bool { p, _ := rec.get(web.UID); return p.Ingress.Isolated })

	// A peer arrives, with an address, on another node.
	peer := mkPod("default", "client", "", map[string]string{"role": "client"}, onNode("n2"))
	if _, err := client.CoreV1().Pods("default").Create(ctx, peer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	peer.Status.PodIP, peer.Status.PodIPs = "10.0.1.7", []corev1.PodIP{{IP: "10.0.1.7"}}
	if _, err := client.CoreV1().Pods("default").UpdateStatus(ctx, peer, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	withPeer := Policy{Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{host("10.0.1.7")}}}}}
	poll.Until(t, 10*time.Second, "the peer's address", func() bool { p, _ := rec.get(web.UID); return reflect.DeepEqual(p, withPeer) })
	_, n := rec.get(web.UID)

	// A change that changes nothing for web sends nothing.
	if _, err := client.CoreV1().Namespaces().Create(ctx, mkNS("unrelated", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, again := rec.get(web.UID); again != n {
		t.Errorf("web's unchanged policy sent again (%d → %d calls)", n, again)
	}

	// A new local pod whose apply fails at first is retried.
	late := mkPod("default", "late", "10.0.0.3", nil)
	rec.mu.Lock()
	rec.fail[string(late.UID)] = ErrNoNetwork
	rec.mu.Unlock()
	if _, err := client.CoreV1().Pods("default").Create(ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	rec.mu.Lock()
	delete(rec.fail, string(late.UID))
	rec.mu.Unlock()
	poll.Until(t, 10*time.Second, "the retried pod", func() bool { _, n := rec.get(late.UID); return n == 1 })

	// The peer goes: web's rule allows nothing any more.
	if err := client.CoreV1().Pods("default").Delete(ctx, "client", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the peer's removal", func() bool {
		p, _ := rec.get(web.UID)
		return reflect.DeepEqual(p, Policy{Ingress: Direction{Isolated: true}})
	})
	// The policy goes: web is open again.
	if err := client.NetworkingV1().NetworkPolicies("default").Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the policy's removal", func() bool { p, _ := rec.get(web.UID); return reflect.DeepEqual(p, Policy{}) })

	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func TestResyncSendsEverythingAgain(t *testing.T) {
	web := mkPod("default", "web", "10.0.0.2", nil)
	rec := &recorder{calls: map[string]int{}, last: map[string]Policy{}, fail: map[string]error{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := New(Config{Client: fake.NewClientset(web), NodeName: node, Applier: rec, Resync: 50 * time.Millisecond})
	go c.Run(ctx)
	poll.Until(t, 10*time.Second, "three sends", func() bool { _, n := rec.get(web.UID); return n >= 3 })
}

func TestEnsureRBAC(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	for _, user := range []string{"system:node:a", "system:node:a", "system:node:b"} {
		if err := EnsureRBAC(ctx, client, user); err != nil {
			t.Fatal(err)
		}
	}
	role, err := client.RbacV1().ClusterRoles().Get(ctx, RoleName, metav1.GetOptions{})
	if err != nil || !reflect.DeepEqual(role.Rules, Rules()) {
		t.Fatalf("role %v %v", role, err)
	}
	b, err := client.RbacV1().ClusterRoleBindings().Get(ctx, RoleName, metav1.GetOptions{})
	if err != nil || len(b.Subjects) != 2 || b.Subjects[0].Name != "system:node:a" || b.Subjects[1].Name != "system:node:b" {
		t.Fatalf("binding %+v %v", b, err)
	}
	if err := EnsureRBAC(ctx, client, ""); err == nil {
		t.Error("empty user accepted")
	}
}
