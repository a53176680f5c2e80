package dataplane

import (
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

var (
	vip      = netip.MustParseAddr("10.96.0.10")
	vipA     = netip.MustParseAddr("10.96.0.11") // A alone behind it
	vipEmpty = netip.MustParseAddr("10.96.0.12") // no endpoints
)

// svcFixture is the fixture's node with a Service range, both pods and a
// third, C, the client.
func svcFixture(t *testing.T) (*fixture, Node, Pod) {
	t.Helper()
	f := newFixture(t)
	n := f.upServices()
	c := f.pod("cccc-3", "100.64.7.4")
	return f, n, c
}

// upServices brings up the fixture's node with a Service range
// (10.96.0.0/16) and both pods on it, and returns that node.
func (f *fixture) upServices() Node {
	f.t.Helper()
	n := testNode
	n.ServiceCIDR = pfx("10.96.0.0/16")
	f.upOn(n)
	return n
}

func (f *fixture) setServices(n Node, svcs ...Service) {
	f.t.Helper()
	if err := f.dp.SetServices(n, svcs); err != nil {
		f.t.Fatalf("SetServices: %v", err)
	}
}

// hit connects from nsPath to the Service and returns which server
// accepted it and the client address that server saw.
func hit(t *testing.T, nsPath string, to netip.AddrPort, servers map[string]*server) (string, netip.Addr) {
	t.Helper()
	if err := connect(t, nsPath, to, 3*time.Second); err != nil {
		t.Fatalf("%s → %v: %v", filepath.Base(nsPath), to, err)
	}
	cases := time.After(3 * time.Second)
	for {
		for name, s := range servers {
			select {
			case a := <-s.peers:
				return name, a
			default:
			}
		}
		select {
		case <-cases:
			t.Fatalf("%s → %v connected, but no endpoint saw it", filepath.Base(nsPath), to)
		case <-time.After(time.Millisecond):
		}
	}
}

func tcpSvc(ip netip.Addr, eps ...netip.AddrPort) Service {
	return Service{Protocol: TCP, IP: ip, Port: 80, Endpoints: eps}
}

// TestServices: a ClusterIP spreads connections over both endpoints and
// the backend sees the client pod's own address; the node and a pod
// reaching itself are masqueraded to the gateway; a Service without
// endpoints is refused at once; a NetworkPolicy applies to traffic that
// came through a Service; removing a Service removes its rules.
func TestServices(t *testing.T) {
	f, n, c := svcFixture(t)
	servers := map[string]*server{"a": serve(t, f.a.NetNS, 8080), "b": serve(t, f.b.NetNS, 8080)}
	f.setServices(n,
		tcpSvc(vip, at(f.a.IP), at(f.b.IP)),
		tcpSvc(vipA, at(f.a.IP)),
		tcpSvc(vipEmpty),
	)
	if f.sysctl("net/bridge/bridge-nf-call-iptables") != "1" {
		t.Fatal("SetServices left br_netfilter off: replies bridged between pods would miss conntrack")
	}

	seen := map[string]int{}
	for range 40 {
		who, src := hit(t, c.NetNS, netip.AddrPortFrom(vip, 80), servers)
		if src != c.IP {
			t.Fatalf("the backend saw the client as %v, want the pod's %v", src, c.IP)
		}
		seen[who]++
	}
	if seen["a"] < 5 || seen["b"] < 5 {
		t.Fatalf("40 connections spread %v over the endpoints; want both used", seen)
	}

	// A pod through its own Service, and the node: masqueraded to the gateway.
	if _, src := hit(t, f.a.NetNS, netip.AddrPortFrom(vipA, 80), servers); src != n.Gateway {
		t.Errorf("hairpin: A reached itself from %v, want the gateway %v", src, n.Gateway)
	}
	if _, src := hit(t, f.hostNS, netip.AddrPortFrom(vipA, 80), servers); src != n.Gateway {
		t.Errorf("the node reached A through the Service from %v, want the gateway %v", src, n.Gateway)
	}

	// No endpoints: refused at once, from a pod and from the node (whose
	// reset comes back by lo, up on every real host).
	h := f.handle(f.hostNS)
	lo, err := h.LinkByName("lo")
	if err != nil || h.LinkSetUp(lo) != nil {
		t.Fatalf("lo up in the host namespace: %v", err)
	}
	h.Close()
	for _, from := range []string{c.NetNS, f.hostNS} {
		start := time.Now()
		err := connect(t, from, netip.AddrPortFrom(vipEmpty, 80), 3*time.Second)
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
			t.Fatalf("%s → a Service without endpoints: %v after %v, want connection refused at once", filepath.Base(from), err, time.Since(start))
		}
	}

	// A's ingress allows only B: through the Service too, by B's real address.
	f.setPolicy(f.a, Policy{Ingress: Direction{Isolated: true, Rules: []Rule{{Peers: []Peer{peer(f.b.IP)}}}}})
	f.blocked(c.NetNS, netip.AddrPortFrom(vipA, 80))
	if who, src := hit(t, f.b.NetNS, netip.AddrPortFrom(vipA, 80), servers); who != "a" || src != f.b.IP {
		t.Fatalf("B → A's Service reached %s from %v", who, src)
	}
	f.setPolicy(f.a, Policy{})

	// Dropping endpoint B and the Service of A: only A answers, and A's
	// Service's port is closed (the node has no listener on it).
	f.setServices(n, tcpSvc(vip, at(f.a.IP)))
	for range 10 {
		if who, _ := hit(t, c.NetNS, netip.AddrPortFrom(vip, 80), servers); who != "a" {
			t.Fatalf("an endpoint removed still receives connections (%s)", who)
		}
	}
	if err := connect(t, c.NetNS, netip.AddrPortFrom(vipA, 80), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a removed Service: %v, want refused by the node", err)
	}
	if got := f.serviceChains(); strings.Join(got, " ") != "svc-10.96.0.10-80-tcp ep-10.96.0.10-80-tcp-100.64.7.2-8080" {
		t.Fatalf("chains left after the update: %v", got)
	}
	f.setServices(n)
	if got := f.serviceChains(); len(got) != 0 {
		t.Fatalf("chains left after removing every Service: %v", got)
	}
	if err := f.dp.DelNode(n); err != nil {
		t.Fatal(err)
	}
	tables, err := f.nft().ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == servicesTable {
			t.Fatal("DelNode left table ip k3sm-services")
		}
	}
}

// serviceChains lists the per-Service and per-endpoint chains.
func (f *fixture) serviceChains() []string {
	f.t.Helper()
	chains, err := f.nft().ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, ch := range chains {
		if ch.Table.Name == servicesTable && (strings.HasPrefix(ch.Name, svcChainPrefix) || strings.HasPrefix(ch.Name, epChainPrefix)) {
			out = append(out, ch.Name)
		}
	}
	return out
}

// TestServicesUDP: datagrams reach the endpoint and the answer comes back
// from the ClusterIP; a UDP Service without endpoints answers with port
// unreachable.
func TestServicesUDP(t *testing.T) {
	f, n, c := svcFixture(t)
	var pc net.PacketConn
	in(t, f.a.NetNS, func() (err error) {
		pc, err = net.ListenPacket("udp4", "0.0.0.0:5353")
		return err
	})
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			m, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte("a:"+from.(*net.UDPAddr).IP.String()+":"), buf[:m]...), from)
		}
	}()
	f.setServices(n,
		Service{Protocol: UDP, IP: vip, Port: 53, Endpoints: []netip.AddrPort{netip.AddrPortFrom(f.a.IP, 5353)}},
		Service{Protocol: UDP, IP: vipEmpty, Port: 53},
	)
	exchange := func(to netip.Addr) (string, error) {
		var reply string
		var xerr error
		in(t, c.NetNS, func() error {
			conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(to, 53)))
			if err != nil {
				return err
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := conn.Write([]byte("ping")); err != nil {
				return err
			}
			buf := make([]byte, 512)
			// A connected socket takes only the ClusterIP's answer: a
			// reply from the pod's own address would not be read here.
			m, err := conn.Read(buf)
			reply, xerr = string(buf[:m]), err
			return nil
		})
		return reply, xerr
	}
	got, err := exchange(vip)
	if err != nil || got != "a:"+c.IP.String()+":ping" {
		t.Fatalf("UDP through the Service: %q %v", got, err)
	}
	if _, err := exchange(vipEmpty); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("UDP to a Service without endpoints: %v, want port unreachable (connection refused)", err)
	}
}

// TestServicesRefuses: bad sets are refused before anything changes.
func TestServicesRefuses(t *testing.T) {
	f, n, _ := svcFixture(t)
	f.setServices(n, tcpSvc(vip, at(f.a.IP)))
	for name, svcs := range map[string][]Service{
		"SCTP":            {{Protocol: SCTP, IP: vip, Port: 80}},
		"outside range":   {tcpSvc(netip.MustParseAddr("10.97.0.1"))},
		"inside pods":     {tcpSvc(f.b.IP)},
		"port 0":          {{Protocol: TCP, IP: vip}},
		"twice":           {tcpSvc(vip), tcpSvc(vip)},
		"endpoint twice":  {tcpSvc(vip, at(f.a.IP), at(f.a.IP))},
		"endpoint port 0": {tcpSvc(vip, netip.AddrPortFrom(f.a.IP, 0))},
	} {
		if err := f.dp.SetServices(n, svcs); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if got := f.serviceChains(); len(got) != 2 {
		t.Fatalf("a refused set changed the rules: %v", got)
	}
	if out, err := exec.Command("nsenter", "--net="+f.hostNS, "nft", "list", "table", "ip", servicesTable).CombinedOutput(); err == nil {
		// nft (when installed) reads the table back: every rule is one it understands.
		if s := string(out); !strings.Contains(s, "numgen random mod 1") || !strings.Contains(s, "dnat to 100.64.7.2:8080") {
			t.Errorf("nft list table shows:\n%s", s)
		}
	}
}

// TestServicesScale: a cluster's worth of Service ports is one
// transaction of bounded time, and one of them still translates.
func TestServicesScale(t *testing.T) {
	f, n, c := svcFixture(t)
	srv := serve(t, f.a.NetNS, 8080)
	var svcs []Service
	for i := range 2000 {
		ip := netip.AddrFrom4([4]byte{10, 96, byte(1 + i/250), byte(1 + i%250)})
		svcs = append(svcs, tcpSvc(ip, at(f.a.IP), at(f.b.IP), at(c.IP)))
	}
	last := svcs[len(svcs)-1]
	last.Endpoints = []netip.AddrPort{at(f.a.IP)}
	svcs[len(svcs)-1] = last
	for round := range 2 { // create, then replace
		if round == 1 { // a changed set: an unchanged one is not rebuilt
			svcs[0].Endpoints = svcs[0].Endpoints[:2]
		}
		start := time.Now()
		if err := f.dp.SetServices(n, svcs); err != nil {
			t.Fatalf("round %d: %v", round+1, err)
		}
		d := time.Since(start)
		t.Logf("SetServices of 2000 Service ports × 3 endpoints (round %d): %v", round+1, d)
		if d > 10*time.Second {
			t.Errorf("SetServices of 2000 ports took %v", d)
		}
	}
	if _, src := hit(t, c.NetNS, netip.AddrPortFrom(last.IP, 80), map[string]*server{"a": srv}); src != c.IP {
		t.Fatalf("the last Service reached A from %v", src)
	}

	// A Service of more endpoints than one message holds gets a named map,
	// filled in several messages of the same transaction: all of them land.
	big := tcpSvc(vip)
	for i := range maxServiceEndpoints {
		big.Endpoints = append(big.Endpoints, netip.AddrPortFrom(f.a.IP, uint16(20000+i)))
	}
	f.setServices(n, big)
	c2 := f.nft()
	set, err := c2.GetSetByName(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: servicesTable}, epMapPrefix+chainPart(vip, 80, TCP))
	if err != nil {
		t.Fatal(err)
	}
	els, err := c2.GetSetElements(set)
	if err != nil || len(els) != maxServiceEndpoints {
		t.Fatalf("the endpoint map of a %d-endpoint Service holds %d elements (%v)", maxServiceEndpoints, len(els), err)
	}
	// And it translates: every index numgen draws is a key of the map
	// (a miss would leave the connection to the node, which refuses it).
	in(t, f.a.NetNS, func() error {
		for _, e := range big.Endpoints {
			ln, err := net.Listen("tcp4", e.String())
			if err != nil {
				return err
			}
			t.Cleanup(func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
		}
		return nil
	})
	for range 20 {
		if err := connect(t, c.NetNS, netip.AddrPortFrom(vip, 80), 3*time.Second); err != nil {
			t.Fatalf("through the %d-endpoint map: %v", maxServiceEndpoints, err)
		}
	}
	svcMap, err := c2.GetSetByName(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: servicesTable}, servicesMap)
	if err != nil {
		t.Fatal(err)
	}
	if els, err := c2.GetSetElements(svcMap); err != nil || len(els) != 1 {
		t.Fatalf("services map after replacing 2000 ports by one: %d elements (%v)", len(els), err)
	}
}

// The node's periodic resend of an unchanged set rebuilds nothing while the
// table is there (a chain the test adds survives it); a changed set, or a
// table someone removed, is applied.
func TestServicesUnchangedSetNotRebuilt(t *testing.T) {
	f, n, _ := svcFixture(t)
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: servicesTable}
	marked := func() bool {
		t.Helper()
		chains, err := f.nft().ListChainsOfTableFamily(nftables.TableFamilyIPv4)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(chains, func(c *nftables.Chain) bool { return c.Table.Name == servicesTable && c.Name == "test-marker" })
	}
	mark := func() {
		t.Helper()
		c := f.nft()
		c.AddChain(&nftables.Chain{Table: table, Name: "test-marker"})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	svc := tcpSvc(vip, at(f.a.IP))
	f.setServices(n, svc)
	mark()
	f.setServices(n, svc)
	if !marked() {
		t.Fatal("an unchanged set rebuilt the table")
	}
	f.setServices(n, tcpSvc(vip, at(f.a.IP), at(f.b.IP)))
	if marked() {
		t.Fatal("a changed set left the table as it was")
	}
	c := f.nft()
	c.DelTable(table)
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	f.setServices(n, tcpSvc(vip, at(f.a.IP), at(f.b.IP)))
	if _, err := f.nft().ListTableOfFamily(servicesTable, nftables.TableFamilyIPv4); err != nil {
		t.Fatalf("the same set after the table was removed: %v", err)
	}
}

// TestServicesExternalIP: an external IP (TEST-NET-3, owned here by the
// test's "outside" namespace) is translated to its endpoint for a pod and
// for a client beyond the node's uplink, as a ClusterIP; one without
// endpoints is refused at the node, where without the forward rule the
// pod's connection would be routed out to the address's real owner. An
// address outside the Service range is refused unless marked external.
func TestServicesExternalIP(t *testing.T) {
	f, n, c := svcFixture(t)
	out := f.outside()
	ext := netip.MustParseAddr("203.0.113.10")      // served: A behind it
	extEmpty := netip.MustParseAddr("203.0.113.11") // no endpoints; the outside owns it
	// The node's default route is the uplink; the outside reaches ext
	// through the node and has extEmpty itself, with a server on it.
	// lo up carries the reset to the node's own refused connection.
	h := f.handle(f.hostNS)
	if err := h.RouteAdd(&netlink.Route{Gw: net.IPv4(192, 0, 2, 2)}); err != nil {
		t.Fatalf("default route of the host namespace: %v", err)
	}
	if hlo, err := h.LinkByName("lo"); err != nil || h.LinkSetUp(hlo) != nil {
		t.Fatalf("lo up in the host namespace: %v", err)
	}
	h.Close()
	o := f.handle(out)
	lo, err := o.LinkByName("lo")
	if err != nil || o.LinkSetUp(lo) != nil {
		t.Fatalf("lo up outside: %v", err)
	}
	if err := o.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: extEmpty.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := o.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: ext.AsSlice(), Mask: net.CIDRMask(32, 32)}, Gw: net.IPv4(192, 0, 2, 1)}); err != nil {
		t.Fatal(err)
	}
	o.Close()
	owner := serve(t, out, 80)
	a := serve(t, f.a.NetNS, 8080)

	// Without a Service the pod's connection goes out to the owner: the
	// leak the forward rule must stop.
	if src := owner.reach(t, c.NetNS, netip.AddrPortFrom(extEmpty, 80)); src != netip.MustParseAddr("192.0.2.1") {
		t.Fatalf("the outside owner saw the pod as %v, want the node's uplink address (masquerade)", src)
	}

	if err := f.dp.SetServices(n, []Service{tcpSvc(ext, at(f.a.IP))}); err == nil || !strings.Contains(err.Error(), "outside the Service range") {
		t.Fatalf("an address outside the Service range, not marked external: %v", err)
	}
	f.setServices(n,
		Service{Protocol: TCP, IP: ext, Port: 80, External: true, Endpoints: []netip.AddrPort{at(f.a.IP)}},
		Service{Protocol: TCP, IP: extEmpty, Port: 80, External: true},
	)
	if src := a.reach(t, c.NetNS, netip.AddrPortFrom(ext, 80)); src != c.IP {
		t.Fatalf("through the external IP A saw the pod as %v, want its own %v", src, c.IP)
	}
	if src := a.reach(t, out, netip.AddrPortFrom(ext, 80)); src != n.Gateway {
		t.Fatalf("a client beyond the uplink reached A from %v, want the gateway %v", src, n.Gateway)
	}
	start := time.Now()
	err = connect(t, c.NetNS, netip.AddrPortFrom(extEmpty, 80), 2*time.Second)
	select {
	case src := <-owner.peers:
		t.Fatalf("a pod's connection to an external IP without endpoints left the node (the owner saw %v)", src)
	default:
	}
	if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
		t.Fatalf("pod → an external IP without endpoints: %v after %v, want connection refused at once", err, time.Since(start))
	}
	// The node's own connection is refused as well (output-filter).
	if err := connect(t, f.hostNS, netip.AddrPortFrom(extEmpty, 80), 2*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("node → an external IP without endpoints: %v, want connection refused", err)
	}
	select {
	case src := <-owner.peers:
		t.Fatalf("the node's connection to an external IP without endpoints left it (the owner saw %v)", src)
	default:
	}
}

// TestServicesNodePortLocal: a nodePort on the node's uplink address
// (192.0.2.1) reached by a client beyond the uplink: with Local the
// backend sees the client's own address (the masquerade exemption), with
// Cluster the gateway's. A node address without endpoints is refused; a node
// address that is not local is not intercepted (fib); netd refuses a
// Local endpoint off the node and Local on a ClusterIP.
func TestServicesNodePortLocal(t *testing.T) {
	f, n, c := svcFixture(t)
	out := f.outside()
	client := netip.MustParseAddr("192.0.2.2")
	node := netip.MustParseAddr("192.0.2.1")
	// A node address the host does not have: routed to the outside,
	// which owns it and serves on the same port.
	lost := netip.MustParseAddr("198.51.100.7")
	h := f.handle(f.hostNS)
	if hlo, err := h.LinkByName("lo"); err != nil || h.LinkSetUp(hlo) != nil {
		t.Fatalf("lo up in the host namespace: %v", err)
	}
	if err := h.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: lost.AsSlice(), Mask: net.CIDRMask(32, 32)}, Gw: client.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	h.Close()
	o := f.handle(out)
	lo, err := o.LinkByName("lo")
	if err != nil || o.LinkSetUp(lo) != nil {
		t.Fatalf("lo up outside: %v", err)
	}
	if err := o.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: lost.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	o.Close()
	owner := serve(t, out, 30082)
	a := serve(t, f.a.NetNS, 8080)

	const local, cluster, empty, notLocal = 30080, 30081, 30083, 30082
	np := func(ip netip.Addr, port uint16, isLocal bool, eps ...netip.AddrPort) Service {
		return Service{Protocol: TCP, IP: ip, Port: port, OnNode: true, Local: isLocal, Endpoints: eps}
	}
	f.setServices(n,
		np(node, local, true, at(f.a.IP)),
		np(node, cluster, false, at(f.a.IP)),
		np(node, empty, true),
		np(lost, notLocal, false, at(f.a.IP)),
	)
	if src := a.reach(t, out, netip.AddrPortFrom(node, local)); src != client {
		t.Fatalf("Local: the backend saw the client beyond the uplink as %v, want its own %v", src, client)
	}
	if src := a.reach(t, out, netip.AddrPortFrom(node, cluster)); src != n.Gateway {
		t.Fatalf("Cluster: the backend saw the client as %v, want the gateway %v (masqueraded)", src, n.Gateway)
	}
	// A pod and the node through the Local nodePort: the pod keeps its
	// address, the node its own (the reply comes back by the pod's
	// default route); a pod reaching itself is still masqueraded.
	if src := a.reach(t, c.NetNS, netip.AddrPortFrom(node, local)); src != c.IP {
		t.Fatalf("pod → Local nodePort: the backend saw %v, want the pod's %v", src, c.IP)
	}
	if src := a.reach(t, f.hostNS, netip.AddrPortFrom(node, local)); src != node {
		t.Fatalf("node → Local nodePort: the backend saw %v, want the node's %v", src, node)
	}
	if src := a.reach(t, f.a.NetNS, netip.AddrPortFrom(node, local)); src != n.Gateway {
		t.Fatalf("hairpin through a Local nodePort: A saw itself as %v, want the gateway %v", src, n.Gateway)
	}
	// Without endpoints refused at the node, even where a host process
	// listens on the port (the proxy sends none such: it holds the port).
	hostListener := serve(t, f.hostNS, empty)
	start := time.Now()
	if err := connect(t, out, netip.AddrPortFrom(node, empty), 2*time.Second); !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
		t.Fatalf("Local nodePort without endpoints: %v after %v, want connection refused at once", err, time.Since(start))
	}
	select {
	case src := <-hostListener.peers:
		t.Fatalf("a nodePort without endpoints reached the host's listener (from %v)", src)
	default:
	}
	// Not the host's address: a pod's connection is routed on to its
	// owner, untranslated.
	if src := owner.reach(t, c.NetNS, netip.AddrPortFrom(lost, notLocal)); src != node {
		t.Fatalf("the owner of %v saw the pod as %v, want the node's uplink address (masquerade)", lost, src)
	}
	select {
	case src := <-a.peers:
		t.Fatalf("a node address the host does not have was translated (A saw %v)", src)
	default:
	}

	for _, tc := range []struct {
		s    Service
		want string
	}{
		{np(node, local, true, at(netip.MustParseAddr("100.64.9.9"))), "not a pod of this node"},
		{Service{Protocol: TCP, IP: vip, Port: 80, Local: true, Endpoints: []netip.AddrPort{at(f.a.IP)}}, "only an external IP or a node address"},
		{Service{Protocol: TCP, IP: node, Port: 80, OnNode: true, External: true}, "both"},
	} {
		if err := f.dp.SetServices(n, []Service{tc.s}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetServices(%+v): %v, want an error with %q", tc.s, err, tc.want)
		}
	}
}
