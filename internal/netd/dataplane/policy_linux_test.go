package dataplane

import (
	"bufio"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func peer(ip netip.Addr) Peer { return Peer{CIDR: netip.PrefixFrom(ip, 32)} }

func (f *fixture) setPolicy(p Pod, pol Policy) {
	f.t.Helper()
	if err := f.dp.SetPolicy(testNode, p, pol); err != nil {
		f.t.Fatalf("SetPolicy %s: %v", p.UID, err)
	}
}

// pod adds a third pod to the fixture's node.
func (f *fixture) pod(uid, ip string) Pod {
	f.t.Helper()
	p := Pod{UID: uid, IP: netip.MustParseAddr(ip), NetNS: filepath.Join(f.dir, "netns", uid), HostIf: HostIfName(uid)}
	f.t.Cleanup(func() { removeNetNS(p.NetNS) })
	if err := f.dp.AddPod(testNode, p); err != nil {
		f.t.Fatal(err)
	}
	return p
}

const blockedWait = 400 * time.Millisecond

func (f *fixture) blocked(from string, to netip.AddrPort) {
	f.t.Helper()
	if err := connect(f.t, from, to, blockedWait); err == nil {
		f.t.Fatalf("%s → %v connected; the policy should drop it", filepath.Base(from), to)
	}
}

func (f *fixture) allowed(from string, to netip.AddrPort) {
	f.t.Helper()
	if err := connect(f.t, from, to, 3*time.Second); err != nil {
		f.t.Fatalf("%s → %v: %v", filepath.Base(from), to, err)
	}
}

func port(ip netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(ip, p) }

var denyIngress = Policy{Ingress: Direction{Isolated: true}}

// TestPolicyIngress: default deny blocks pods but not the node; an allow
// from B's address on TCP 8080 lets exactly that through; an empty policy
// restores everything.
func TestPolicyIngress(t *testing.T) {
	f := newFixture(t)
	f.up()
	serve(t, f.a.NetNS, 8080)
	serve(t, f.a.NetNS, 8081)
	f.allowed(f.b.NetNS, port(f.a.IP, 8081))

	f.setPolicy(f.a, denyIngress)
	f.blocked(f.b.NetNS, port(f.a.IP, 8080))
	f.blocked(f.b.NetNS, port(f.a.IP, 8081))
	// The node (the kubelet's probes, the Service proxy) still reaches it.
	f.allowed(f.hostNS, port(f.a.IP, 8080))
	// A's own egress is not isolated: it reaches B, and B's replies come back.
	serve(t, f.b.NetNS, 8080)
	f.allowed(f.a.NetNS, port(f.b.IP, 8080))

	f.setPolicy(f.a, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{
		{Peers: []Peer{peer(f.b.IP)}, Ports: []Port{{Protocol: TCP, Port: 8080}}},
	}}})
	f.allowed(f.b.NetNS, port(f.a.IP, 8080))
	f.blocked(f.b.NetNS, port(f.a.IP, 8081))

	// A range of ports, and a rule with no peers (any source).
	c := f.pod("cccc-3", "100.64.7.4")
	f.setPolicy(f.a, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{
		{Peers: []Peer{peer(f.b.IP)}, Ports: []Port{{Protocol: TCP, Port: 8000, EndPort: 8080}, {Protocol: UDP}}},
		{Ports: []Port{{Protocol: TCP, Port: 8081}}},
	}}})
	f.allowed(f.b.NetNS, port(f.a.IP, 8080))
	f.allowed(c.NetNS, port(f.a.IP, 8081))
	f.blocked(c.NetNS, port(f.a.IP, 8080))

	f.setPolicy(f.a, Policy{})
	f.allowed(f.b.NetNS, port(f.a.IP, 8081))
	f.allowed(c.NetNS, port(f.a.IP, 8080))
}

// TestPolicyEgress: egress deny blocks A → B but not A → the node, and
// replies to connections into A still leave it.
func TestPolicyEgress(t *testing.T) {
	f := newFixture(t)
	f.up()
	serve(t, f.a.NetNS, 8080)
	serve(t, f.b.NetNS, 8080)
	node := serve(t, f.hostNS, 9090)
	f.setPolicy(f.a, Policy{Egress: Direction{Isolated: true}})
	f.blocked(f.a.NetNS, port(f.b.IP, 8080))
	if src := node.reach(t, f.a.NetNS, port(testNode.Gateway, 9090)); src != f.a.IP {
		t.Errorf("A → node arrived from %v", src)
	}
	f.allowed(f.b.NetNS, port(f.a.IP, 8080))

	// Egress allowed to B, but B isolates its ingress: both must agree.
	f.setPolicy(f.a, Policy{Egress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{peer(f.b.IP)}}}}})
	f.allowed(f.a.NetNS, port(f.b.IP, 8080))
	f.setPolicy(f.b, denyIngress)
	f.blocked(f.a.NetNS, port(f.b.IP, 8080))
	f.setPolicy(f.b, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{peer(f.a.IP)}}}}})
	f.allowed(f.a.NetNS, port(f.b.IP, 8080))
}

// TestPolicyIPBlockExcept: a range less an exception.
func TestPolicyIPBlockExcept(t *testing.T) {
	f := newFixture(t)
	f.up()
	c := f.pod("cccc-3", "100.64.7.4")
	serve(t, f.a.NetNS, 8080)
	f.setPolicy(f.a, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{
		{Peers: []Peer{{CIDR: pfx("100.64.7.0/24"), Except: []netip.Prefix{pfx("100.64.7.3/32")}}}},
	}}})
	f.blocked(f.b.NetNS, port(f.a.IP, 8080))
	f.allowed(c.NetNS, port(f.a.IP, 8080))
	// 0.0.0.0/0 less the pod range: neither pod.
	f.setPolicy(f.a, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{
		{Peers: []Peer{{CIDR: pfx("0.0.0.0/0"), Except: []netip.Prefix{pfx("100.64.0.0/16")}}}},
	}}})
	f.blocked(c.NetNS, port(f.a.IP, 8080))
	// Overlapping peers of two selectors merge into one set.
	f.setPolicy(f.a, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{
		{Peers: []Peer{{CIDR: pfx("100.64.7.0/30")}, peer(f.b.IP), peer(c.IP), {CIDR: pfx("0.0.0.0/0"), Except: []netip.Prefix{pfx("100.64.7.0/24")}}}},
	}}})
	f.allowed(f.b.NetNS, port(f.a.IP, 8080))
	f.allowed(c.NetNS, port(f.a.IP, 8080))
}

// TestPolicyKeepsConnections: a policy change never cuts a connection it
// had allowed (conntrack accepts it first), while new ones are refused.
func TestPolicyKeepsConnections(t *testing.T) {
	f := newFixture(t)
	f.up()
	var ln net.Listener
	in(t, f.a.NetNS, func() (err error) { ln, err = net.Listen("tcp4", ":7070"); return err })
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s := bufio.NewScanner(c)
				for s.Scan() {
					c.Write([]byte(strings.ToUpper(s.Text()) + "\n"))
				}
			}()
		}
	}()
	var conn net.Conn
	in(t, f.b.NetNS, func() (err error) {
		conn, err = net.DialTimeout("tcp4", port(f.a.IP, 7070).String(), 3*time.Second)
		return err
	})
	defer conn.Close()
	rd := bufio.NewReader(conn)
	echo := func(msg string) {
		t.Helper()
		conn.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := conn.Write([]byte(msg + "\n")); err != nil {
			t.Fatal(err)
		}
		got, err := rd.ReadString('\n')
		if err != nil || got != strings.ToUpper(msg)+"\n" {
			t.Fatalf("echo %q: %q %v", msg, got, err)
		}
	}
	echo("before")
	f.setPolicy(f.a, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{peer(f.b.IP)}}}}})
	echo("allowed")
	f.setPolicy(f.a, denyIngress)
	echo("established")
	f.blocked(f.b.NetNS, port(f.a.IP, 7070))
}

// TestPolicyGuard: a pod cannot borrow an allowed peer's address, since
// its port forwards only its own.
func TestPolicyGuard(t *testing.T) {
	f := newFixture(t)
	f.up()
	serve(t, f.a.NetNS, 8080)
	spoofed := netip.MustParseAddr("100.64.7.9")
	h := f.handle(f.b.NetNS)
	a, _ := netlink.ParseAddr(spoofed.String() + "/24")
	if err := h.AddrAdd(f.link(f.b.NetNS, "eth0"), a); err != nil {
		t.Fatal(err)
	}
	dialFrom := func(src netip.Addr, timeout time.Duration) error {
		var derr error
		in(t, f.b.NetNS, func() error {
			d := net.Dialer{Timeout: timeout, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
			c, err := d.Dial("tcp4", port(f.a.IP, 8080).String())
			if err == nil {
				c.Close()
			}
			derr = err
			return nil
		})
		return derr
	}
	if err := dialFrom(spoofed, 3*time.Second); err != nil {
		t.Fatalf("before any policy, a second address works: %v", err)
	}
	f.setPolicy(f.b, Policy{})
	f.setPolicy(f.a, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{peer(spoofed)}}}}})
	if err := dialFrom(spoofed, blockedWait); err == nil {
		t.Fatal("B reached A from an address that is not its own")
	}
	f.blocked(f.b.NetNS, port(f.a.IP, 8080))
}

// TestPolicyObjects: a repeat keeps one set of objects, an IP change
// moves the pod's elements, and DelPod and DelNode leave nothing.
func TestPolicyObjects(t *testing.T) {
	f := newFixture(t)
	in(t, f.hostNS, func() error { return writeKnob("net/bridge/bridge-nf-call-iptables", "0") })
	f.up()
	pol := Policy{
		Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{peer(f.b.IP)}, Ports: []Port{{Protocol: TCP, Port: 80}, {Protocol: UDP, Port: 53}}}}},
		Egress:  Direction{Isolated: true},
	}
	f.setPolicy(f.a, pol)
	f.setPolicy(f.a, pol)
	f.setPolicy(f.b, Policy{})
	if got := f.sysctl("net/bridge/bridge-nf-call-iptables"); got != "1" {
		t.Errorf("bridge-nf-call-iptables = %s after an isolating policy, want 1", got)
	}
	c := f.nft()
	pt := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: policyTable}
	rules, err := c.GetRules(pt, &nftables.Chain{Name: ingressChain(f.a.HostIf)})
	if err != nil || len(rules) != 3 {
		t.Fatalf("ingress chain: %d rules (%v), want tcp, udp and drop", len(rules), err)
	}
	elems := func(table *nftables.Table, name string) int {
		t.Helper()
		els, err := c.GetSetElements(&nftables.Set{Table: table, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return len(els)
	}
	gt := &nftables.Table{Family: nftables.TableFamilyBridge, Name: guardTable}
	if i, e, g := elems(pt, ingressMap), elems(pt, egressMap), elems(gt, guardMap); i != 1 || e != 1 || g != 2 {
		t.Fatalf("elements: ingress %d egress %d guard %d, want 1 1 2", i, e, g)
	}
	// Narrowed to ingress only: the egress chain and element go.
	f.setPolicy(f.a, Policy{Ingress: pol.Ingress})
	if e := elems(pt, egressMap); e != 0 {
		t.Errorf("egress elements %d after dropping egress isolation", e)
	}
	if err := f.dp.DelPod(f.a); err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if strings.HasPrefix(ch.Name, f.a.HostIf) {
			t.Errorf("chain %s left after DelPod", ch.Name)
		}
	}
	if i, g := elems(pt, ingressMap), elems(gt, guardMap); i != 0 || g != 1 {
		t.Errorf("after DelPod: ingress %d guard %d elements, want 0 and B's 1", i, g)
	}
	if err := f.dp.DelPod(f.a); err != nil {
		t.Fatalf("DelPod again: %v", err)
	}
	if err := f.dp.DelNode(testNode); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyBridge} {
		tables, err := c.ListTablesOfFamily(fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, tb := range tables {
			if tb.Name == policyTable || tb.Name == guardTable {
				t.Errorf("table %s left after DelNode", tb.Name)
			}
		}
	}
}

func TestSetPolicyRefuses(t *testing.T) {
	f := newFixture(t)
	f.up()
	for _, pol := range []Policy{
		{Ingress: Direction{Rules: []Rule{{}}}},
		{Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{{CIDR: pfx("10.0.0.1/8")}}}}}},
		{Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{{CIDR: pfx("10.0.0.0/8"), Except: []netip.Prefix{pfx("11.0.0.0/8")}}}}}}},
		{Egress: Direction{Isolated: true, Rules: []Rule{{Ports: []Port{{Protocol: 1}}}}}},
		{Egress: Direction{Isolated: true, Rules: []Rule{{Ports: []Port{{Protocol: TCP, Port: 90, EndPort: 80}}}}}},
	} {
		if err := f.dp.SetPolicy(testNode, f.a, pol); err == nil {
			t.Errorf("%+v accepted", pol)
		}
	}
	if err := f.dp.SetPolicy(testNode, Pod{UID: "x", IP: f.a.IP, NetNS: f.a.NetNS, HostIf: "eth0"}, Policy{}); err == nil {
		t.Error("a host interface that is not a pod's accepted")
	}
}

func writeKnob(name, v string) error {
	return os.WriteFile(filepath.Join("/proc/sys", name), []byte(v+"\n"), 0o644)
}
