package dataplane

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Every test builds its own "host" namespace and passes it as
// Options.HostNSPath, so nothing here touches the machine's network.

var testNode = Node{
	CIDR:    netip.MustParsePrefix("100.64.7.0/24"),
	Gateway: netip.MustParseAddr("100.64.7.1"),
	Bridge:  "k3sm0",
}

type fixture struct {
	t      *testing.T
	dir    string
	hostNS string // the namespace file standing in for the host
	dp     Dataplane
	a, b   Pod
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test creates network namespaces")
	}
	dir := t.TempDir()
	f := &fixture{t: t, dir: dir, hostNS: filepath.Join(dir, "host")}
	if err := createNetNS(f.hostNS); err != nil {
		t.Skipf("cannot create a network namespace here: %v", err)
	}
	t.Cleanup(func() { removeNetNS(f.hostNS) })
	netnsDir := filepath.Join(dir, "netns")
	dp, err := New(Options{HostNSPath: f.hostNS, NetNSDir: netnsDir})
	if err != nil {
		t.Fatal(err)
	}
	f.dp = dp
	pod := func(uid, ip string) Pod {
		return Pod{UID: uid, IP: netip.MustParseAddr(ip), NetNS: filepath.Join(netnsDir, uid), HostIf: HostIfName(uid)}
	}
	f.a, f.b = pod("aaaa-1", "100.64.7.2"), pod("bbbb-2", "100.64.7.3")
	t.Cleanup(func() {
		for _, p := range []Pod{f.a, f.b} {
			removeNetNS(p.NetNS)
		}
	})
	return f
}

// up runs EnsureNode and AddPod for both pods.
func (f *fixture) up() {
	f.t.Helper()
	f.upOn(testNode)
}

// upOn runs EnsureNode of n and AddPod for both pods on it.
func (f *fixture) upOn(n Node) {
	f.t.Helper()
	if err := f.dp.EnsureNode(n); err != nil {
		f.t.Fatalf("EnsureNode: %v", err)
	}
	for _, p := range []Pod{f.a, f.b} {
		if err := f.dp.AddPod(n, p); err != nil {
			f.t.Fatalf("AddPod %s: %v", p.UID, err)
		}
	}
}

func (f *fixture) handle(nsPath string) *netlink.Handle {
	f.t.Helper()
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		f.t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(h.Close)
	return h
}

func (f *fixture) link(nsPath, name string) netlink.Link {
	f.t.Helper()
	l, err := f.handle(nsPath).LinkByName(name)
	if err != nil {
		f.t.Fatalf("%s in %s: %v", name, filepath.Base(nsPath), err)
	}
	return l
}

// in runs fn on a thread inside the namespace at nsPath.
func in(t *testing.T, nsPath string, fn func() error) {
	t.Helper()
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := onThread(ns, fn); err != nil {
		t.Fatal(err)
	}
}

// dockerChain adds what Docker leaves in the host: iptables-nft's
// ip filter FORWARD with policy drop.
func (f *fixture) dockerChain() {
	f.t.Helper()
	c := f.nft()
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "filter"})
	drop := nftables.ChainPolicyDrop
	c.AddChain(&nftables.Chain{
		Name: "FORWARD", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop,
	})
	if err := c.Flush(); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) nft() *nftables.Conn {
	f.t.Helper()
	ns, err := netns.GetFromPath(f.hostNS)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { ns.Close() })
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *fixture) rules(table, chain string) []*nftables.Rule {
	f.t.Helper()
	c := f.nft()
	rs, err := c.GetRules(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: table}, &nftables.Chain{Name: chain})
	if err != nil {
		f.t.Fatalf("rules of %s %s: %v", table, chain, err)
	}
	return rs
}

// iptables runs `iptables -S FORWARD` in the host namespace: it fails when
// a rule there is one iptables-nft cannot show.
func (f *fixture) iptables() string {
	f.t.Helper()
	if _, err := exec.LookPath("nsenter"); err != nil {
		f.t.Skip("nsenter not installed")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		f.t.Skip("iptables not installed")
	}
	out, err := exec.Command("nsenter", "--net="+f.hostNS, "iptables", "-S", "FORWARD").CombinedOutput()
	if err != nil {
		f.t.Fatalf("iptables -S FORWARD: %v\n%s", err, out)
	}
	return string(out)
}

func (f *fixture) sysctl(name string) string {
	f.t.Helper()
	var v []byte
	in(f.t, f.hostNS, func() (err error) {
		v, err = os.ReadFile(filepath.Join("/proc/sys", name))
		return err
	})
	return strings.TrimSpace(string(v))
}

// server accepts on port inside a namespace and reports each client's
// source address.
type server struct {
	ln    net.Listener
	peers chan netip.Addr
}

func serve(t *testing.T, nsPath string, port int) *server {
	t.Helper()
	s := &server{peers: make(chan netip.Addr, 8)}
	in(t, nsPath, func() (err error) {
		s.ln, err = net.Listen("tcp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(port)))
		return err
	})
	t.Cleanup(func() { s.ln.Close() })
	go func() {
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			s.peers <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			c.Close()
		}
	}()
	return s
}

// connect dials to from inside the namespace at nsPath.
func connect(t *testing.T, nsPath string, to netip.AddrPort, timeout time.Duration) error {
	t.Helper()
	var dialErr error
	in(t, nsPath, func() error {
		c, err := net.DialTimeout("tcp4", to.String(), timeout)
		if err == nil {
			c.Close()
		}
		dialErr = err
		return nil
	})
	return dialErr
}

// reach connects and returns the source address the server saw.
func (s *server) reach(t *testing.T, nsPath string, to netip.AddrPort) netip.Addr {
	t.Helper()
	if err := connect(t, nsPath, to, 3*time.Second); err != nil {
		t.Fatalf("%s → %v: %v", filepath.Base(nsPath), to, err)
	}
	select {
	case a := <-s.peers:
		return a
	case <-time.After(3 * time.Second):
		t.Fatalf("%s → %v: connected, but the server saw no client", filepath.Base(nsPath), to)
		return netip.Addr{}
	}
}

func at(ip netip.Addr) netip.AddrPort { return netip.AddrPortFrom(ip, 8080) }

// outside connects a namespace to the host by a veth: 192.0.2.1 on the
// host side, 192.0.2.2 outside, the way a node's uplink would.
func (f *fixture) outside() string {
	f.t.Helper()
	path := filepath.Join(f.dir, "outside")
	if err := createNetNS(path); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { removeNetNS(path) })
	ns, err := netns.GetFromPath(path)
	if err != nil {
		f.t.Fatal(err)
	}
	defer ns.Close()
	h, o := f.handle(f.hostNS), f.handle(path)
	la := netlink.NewLinkAttrs()
	la.Name = "uplink0"
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}); err != nil {
		f.t.Fatal(err)
	}
	for _, side := range []struct {
		h          *netlink.Handle
		name, addr string
	}{{h, "uplink0", "192.0.2.1/24"}, {o, "eth0", "192.0.2.2/24"}} {
		l, err := side.h.LinkByName(side.name)
		if err != nil {
			f.t.Fatal(err)
		}
		a, _ := netlink.ParseAddr(side.addr)
		if err := side.h.AddrAdd(l, a); err != nil {
			f.t.Fatal(err)
		}
		if err := side.h.LinkSetUp(l); err != nil {
			f.t.Fatal(err)
		}
	}
	return path
}

// TestPodNetwork: pods reach each other with their own source addresses
// through a Docker-style drop chain, the host reaches both, and traffic
// leaving the node is masqueraded to the uplink's address.
func TestPodNetwork(t *testing.T) {
	f := newFixture(t)
	f.dockerChain()
	in(t, f.hostNS, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("0"), 0o644) })
	out := f.outside()
	f.up()

	if got := f.sysctl("net/ipv4/ip_forward"); got != "1" {
		t.Errorf("ip_forward in the host namespace = %s, want 1", got)
	}
	for _, p := range []Pod{f.a, f.b} {
		h := f.handle(p.NetNS)
		eth0 := f.link(p.NetNS, "eth0")
		addrs, err := h.AddrList(eth0, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) != 1 || prefixOf(addrs[0].IPNet) != netip.PrefixFrom(p.IP, 24) {
			t.Errorf("%s eth0 addresses = %v, want only %v/24", p.UID, addrs, p.IP)
		}
		routes, err := h.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
			return isDefault(r.Dst) && r.Gw.Equal(testNode.Gateway.AsSlice()) && r.LinkIndex == eth0.Attrs().Index
		}) {
			t.Errorf("%s has no default route via %v on eth0: %v", p.UID, testNode.Gateway, routes)
		}
		if mtu := eth0.Attrs().MTU; mtu != defaultMTU {
			t.Errorf("%s eth0 MTU = %d, want %d", p.UID, mtu, defaultMTU)
		}
	}
	if mtu := f.link(f.hostNS, "k3sm0").Attrs().MTU; mtu != defaultMTU {
		t.Errorf("bridge MTU = %d, want %d", mtu, defaultMTU)
	}

	sa, sb := serve(t, f.a.NetNS, 8080), serve(t, f.b.NetNS, 8080)
	if src := sa.reach(t, f.b.NetNS, at(f.a.IP)); src != f.b.IP {
		t.Errorf("B → A arrived from %v, want B's own %v (no NAT between pods)", src, f.b.IP)
	}
	if src := sb.reach(t, f.a.NetNS, at(f.b.IP)); src != f.a.IP {
		t.Errorf("A → B arrived from %v, want %v", src, f.a.IP)
	}
	for _, s := range []struct {
		srv *server
		ip  netip.Addr
	}{{sa, f.a.IP}, {sb, f.b.IP}} {
		if src := s.srv.reach(t, f.hostNS, at(s.ip)); src != testNode.Gateway {
			t.Errorf("host → %v arrived from %v, want the gateway %v", s.ip, src, testNode.Gateway)
		}
	}

	so := serve(t, out, 8080)
	if src := so.reach(t, f.a.NetNS, at(netip.MustParseAddr("192.0.2.2"))); src != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("pod → outside arrived from %v, want the uplink's 192.0.2.1 (masquerade)", src)
	}

	listing := f.iptables()
	for _, want := range []string{"-P FORWARD DROP", "-A FORWARD -i k3sm0 -j ACCEPT", "-A FORWARD -o k3sm0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"} {
		if !strings.Contains(listing, want) {
			t.Errorf("iptables -S FORWARD lacks %q:\n%s", want, listing)
		}
	}

	// Without our accepts the drop policy stops bridged pod traffic
	// (br_netfilter), which is why they go into Docker's chain.
	if f.sysctl("net/bridge/bridge-nf-call-iptables") != "1" {
		t.Log("br_netfilter is off in this namespace: skipping the check that the drop chain blocks pods without our rules")
		return
	}
	c := f.nft()
	for _, r := range f.rules("filter", "FORWARD") {
		if err := c.DelRule(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := connect(t, f.b.NetNS, at(f.a.IP), 500*time.Millisecond); err == nil {
		t.Fatal("B → A connected through a drop chain without our accepts: the test does not exercise the forward rules")
	}
	if ready := f.inventory().NodeReady; ready {
		t.Error("NodeReady with our accepts gone from ip filter FORWARD")
	}
	if err := f.dp.EnsureNode(testNode); err != nil {
		t.Fatal(err)
	}
	if src := sa.reach(t, f.b.NetNS, at(f.a.IP)); src != f.b.IP {
		t.Errorf("after EnsureNode B → A arrived from %v", src)
	}
}

func (f *fixture) inventory() Inventory {
	f.t.Helper()
	inv, err := f.dp.Inventory(testNode)
	if err != nil {
		f.t.Fatal(err)
	}
	return inv
}

// TestIdempotent: a second EnsureNode and AddPod keep one rule set and the
// same links, and AddPod replaces a wrong address without recreating eth0.
func TestIdempotent(t *testing.T) {
	f := newFixture(t)
	f.dockerChain()
	// A rule of "Docker's" that ours must stay ahead of.
	if out, err := exec.Command("nsenter", "--net="+f.hostNS, "iptables", "-A", "FORWARD", "-i", "docker0", "-j", "ACCEPT").CombinedOutput(); err != nil {
		t.Skipf("iptables in the test namespace: %v %s", err, out)
	}
	f.up()
	index := func() map[string]int {
		return map[string]int{
			"bridge": f.link(f.hostNS, "k3sm0").Attrs().Index,
			"a host": f.link(f.hostNS, f.a.HostIf).Attrs().Index,
			"a eth0": f.link(f.a.NetNS, "eth0").Attrs().Index,
			"b host": f.link(f.hostNS, f.b.HostIf).Attrs().Index,
		}
	}
	before := index()
	// The bridge turns RUNNING (carrier) asynchronously once a port is up:
	// let that settle before watching for changes we would cause. Not
	// poll: a bridge still not RUNNING is no failure, only less settled.
	waitRunning := time.Now().Add(5 * time.Second)
	for f.link(f.hostNS, "k3sm0").Attrs().RawFlags&unix.IFF_RUNNING == 0 && time.Now().Before(waitRunning) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	quiet := f.watch(f.hostNS, f.a.NetNS)
	f.up()
	f.up()
	quiet()
	if after := index(); !mapsEqual(before, after) {
		t.Errorf("ifindexes changed on a repeat: %v → %v", before, after)
	}
	if n := len(f.rules("k3sm", "postrouting")); n != 1 {
		t.Errorf("postrouting has %d rules, want 1", n)
	}
	fwd := f.rules("filter", "FORWARD")
	if len(fwd) != 3 {
		t.Errorf("FORWARD has %d rules, want our 2 and Docker's 1", len(fwd))
	}
	listing := f.iptables()
	lines := strings.Split(strings.TrimSpace(listing), "\n")
	want := []string{
		"-P FORWARD DROP",
		"-A FORWARD -i k3sm0 -j ACCEPT",
		"-A FORWARD -o k3sm0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-A FORWARD -i docker0 -j ACCEPT",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("iptables -S FORWARD =\n%s\nwant\n%s", listing, strings.Join(want, "\n"))
	}

	// Someone moved our accepts below a new rule: EnsureNode puts them
	// back at the head, still once.
	if out, err := exec.Command("nsenter", "--net="+f.hostNS, "iptables", "-I", "FORWARD", "-i", "docker1", "-j", "DROP").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if f.inventory().NodeReady {
		t.Error("NodeReady while our accepts are not at the head of FORWARD")
	}
	if err := f.dp.EnsureNode(testNode); err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(f.iptables()), "\n")
	want = []string{want[0], want[1], want[2], "-A FORWARD -i docker1 -j DROP", want[3]}
	if !slices.Equal(lines, want) {
		t.Errorf("after reordering, iptables -S FORWARD =\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	// A wrong address on eth0 is replaced, the link kept.
	h := f.handle(f.a.NetNS)
	eth0 := f.link(f.a.NetNS, "eth0")
	wrong, _ := netlink.ParseAddr("100.64.7.99/24")
	if err := h.AddrAdd(eth0, wrong); err != nil {
		t.Fatal(err)
	}
	right, _ := netlink.ParseAddr(f.a.IP.String() + "/24")
	if err := h.AddrDel(eth0, right); err != nil {
		t.Fatal(err)
	}
	if err := f.dp.AddPod(testNode, f.a); err != nil {
		t.Fatal(err)
	}
	addrs, _ := h.AddrList(eth0, netlink.FAMILY_V4)
	if len(addrs) != 1 || prefixOf(addrs[0].IPNet) != netip.PrefixFrom(f.a.IP, 24) {
		t.Errorf("eth0 addresses after repair = %v, want only %v/24", addrs, f.a.IP)
	}
	if got := f.link(f.a.NetNS, "eth0").Attrs().Index; got != before["a eth0"] {
		t.Errorf("eth0 recreated to fix its address (ifindex %d → %d)", before["a eth0"], got)
	}
	// The route went with the address; AddPod restored it.
	sa := serve(t, f.a.NetNS, 8080)
	sa.reach(t, f.b.NetNS, at(f.a.IP))
	serve(t, f.b.NetNS, 8080).reach(t, f.a.NetNS, at(f.b.IP))
}

// watch records link, address and route changes in the namespaces until
// the returned func, which fails the test if there were any: a repeat on
// a healthy node must not flap a link or touch an address or route.
func (f *fixture) watch(nsPaths ...string) func() {
	f.t.Helper()
	done := make(chan struct{})
	var drains []func()
	for _, p := range nsPaths {
		ns, err := netns.GetFromPath(p)
		if err != nil {
			f.t.Fatal(err)
		}
		defer ns.Close()
		// One channel per subscription: each closes its own when done.
		links := make(chan netlink.LinkUpdate, 64)
		addrs := make(chan netlink.AddrUpdate, 64)
		routes := make(chan netlink.RouteUpdate, 64)
		if err := netlink.LinkSubscribeAt(ns, links, done); err != nil {
			f.t.Fatal(err)
		}
		if err := netlink.AddrSubscribeAt(ns, addrs, done); err != nil {
			f.t.Fatal(err)
		}
		if err := netlink.RouteSubscribeAt(ns, routes, done); err != nil {
			f.t.Fatal(err)
		}
		name := filepath.Base(p)
		drains = append(drains, func() {
			for u := range links {
				f.t.Errorf("%s: link change on a repeat: %s flags %v", name, u.Attrs().Name, u.Attrs().Flags)
			}
			for u := range addrs {
				f.t.Errorf("%s: address change on a repeat: %v new=%v", name, u.LinkAddress, u.NewAddr)
			}
			for u := range routes {
				f.t.Errorf("%s: route change on a repeat: %v", name, u.Route)
			}
		})
	}
	return func() {
		f.t.Helper()
		time.Sleep(100 * time.Millisecond) // let late notifications arrive
		close(done)
		for _, d := range drains {
			d()
		}
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestRepair: AddPod after the veth was deleted recreates it, and the
// pod's namespace, with a listener in it, survives.
func TestRepair(t *testing.T) {
	f := newFixture(t)
	f.up()
	sa := serve(t, f.a.NetNS, 8080)
	var st0 unix.Stat_t
	if err := unix.Stat(f.a.NetNS, &st0); err != nil {
		t.Fatal(err)
	}
	h := f.handle(f.hostNS)
	if err := h.LinkDel(f.link(f.hostNS, f.a.HostIf)); err != nil {
		t.Fatal(err)
	}
	if err := connect(t, f.hostNS, at(f.a.IP), 300*time.Millisecond); err == nil {
		t.Fatal("pod reachable with its veth deleted")
	}
	if err := f.dp.AddPod(testNode, f.a); err != nil {
		t.Fatal(err)
	}
	var st1 unix.Stat_t
	if err := unix.Stat(f.a.NetNS, &st1); err != nil {
		t.Fatal(err)
	}
	if st0.Ino != st1.Ino || st0.Dev != st1.Dev {
		t.Error("AddPod replaced the pod's namespace; it should have kept it")
	}
	if src := sa.reach(t, f.hostNS, at(f.a.IP)); src != testNode.Gateway {
		t.Errorf("host → repaired pod arrived from %v", src)
	}
	if src := sa.reach(t, f.b.NetNS, at(f.a.IP)); src != f.b.IP {
		t.Errorf("B → repaired A arrived from %v", src)
	}
	if m := f.link(f.hostNS, f.a.HostIf).Attrs().MasterIndex; m != f.link(f.hostNS, "k3sm0").Attrs().Index {
		t.Errorf("recreated %s not on the bridge (master %d)", f.a.HostIf, m)
	}
}

// TestInventoryDelPodDelNode: Inventory lists exactly our namespaces and
// links; DelPod and DelNode remove what they own and tolerate what is gone.
func TestInventoryDelPodDelNode(t *testing.T) {
	f := newFixture(t)
	f.dockerChain()
	if inv := f.inventory(); inv.NodeReady || len(inv.NetNS)+len(inv.HostIfs) != 0 {
		t.Errorf("Inventory of an empty host = %+v", inv)
	}
	f.up()
	// Not ours: a link without the prefix (a bridge: the dummy module may be absent).
	la := netlink.NewLinkAttrs()
	la.Name = "other0"
	if err := f.handle(f.hostNS).LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
		t.Fatal(err)
	}
	inv := f.inventory()
	if want := []string{f.a.NetNS, f.b.NetNS}; !slices.Equal(inv.NetNS, want) {
		t.Errorf("Inventory.NetNS = %v, want %v", inv.NetNS, want)
	}
	want := []string{f.a.HostIf, f.b.HostIf}
	slices.Sort(want)
	if !slices.Equal(inv.HostIfs, want) {
		t.Errorf("Inventory.HostIfs = %v, want %v", inv.HostIfs, want)
	}
	if !inv.NodeReady {
		t.Error("NodeReady false after EnsureNode")
	}

	for i := 0; i < 2; i++ {
		if err := f.dp.DelPod(f.a); err != nil {
			t.Fatalf("DelPod #%d: %v", i+1, err)
		}
	}
	if _, err := f.handle(f.hostNS).LinkByName(f.a.HostIf); !isNotFound(err) {
		t.Errorf("%s still there after DelPod (%v)", f.a.HostIf, err)
	}
	if _, err := os.Stat(f.a.NetNS); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns file still there after DelPod (%v)", err)
	}
	inv = f.inventory()
	if !slices.Equal(inv.NetNS, []string{f.b.NetNS}) || !slices.Equal(inv.HostIfs, []string{f.b.HostIf}) {
		t.Errorf("Inventory after DelPod A = %+v", inv)
	}

	// Refused: what is not ours.
	if err := f.dp.DelPod(Pod{NetNS: f.b.NetNS, HostIf: "other0"}); err == nil {
		t.Error("DelPod accepted a host interface without the k3sm prefix")
	}
	if err := f.dp.DelPod(Pod{NetNS: f.hostNS, HostIf: f.b.HostIf}); err == nil {
		t.Error("DelPod accepted a namespace file outside NetNSDir")
	}

	for i := 0; i < 2; i++ {
		if err := f.dp.DelNode(testNode); err != nil {
			t.Fatalf("DelNode #%d: %v", i+1, err)
		}
	}
	if _, err := f.handle(f.hostNS).LinkByName("k3sm0"); !isNotFound(err) {
		t.Errorf("bridge still there after DelNode (%v)", err)
	}
	tables, err := f.nft().ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == "k3sm" }) {
		t.Error("table ip k3sm still there after DelNode")
	}
	if n := len(f.rules("filter", "FORWARD")); n != 0 {
		t.Errorf("FORWARD has %d rules after DelNode, want 0", n)
	}
	if got := strings.TrimSpace(f.iptables()); got != "-P FORWARD DROP" {
		t.Errorf("iptables -S FORWARD after DelNode = %q", got)
	}
	if f.inventory().NodeReady {
		t.Error("NodeReady after DelNode")
	}
}

func TestNewRefuses(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without NetNSDir succeeded")
	}
	if _, err := New(Options{NetNSDir: "relative"}); err == nil {
		t.Error("New with a relative NetNSDir succeeded")
	}
	if _, err := New(Options{NetNSDir: "/run/x", MTU: 10}); err == nil {
		t.Error("New with MTU 10 succeeded")
	}
}

func TestPodNames(t *testing.T) {
	d := &linuxPlane{netnsDir: "/run/k3sm/netns"}
	good := Pod{NetNS: "/run/k3sm/netns/abc", HostIf: HostIfName("abc")}
	if err := d.checkPodNames(good); err != nil {
		t.Errorf("%+v refused: %v", good, err)
	}
	for _, p := range []Pod{
		{NetNS: "/run/k3sm/netns/abc", HostIf: "eth0"},
		{NetNS: "/run/k3sm/netns/abc", HostIf: "k3v0123456789abcdef"},
		{NetNS: "/run/k3sm/netns/../x", HostIf: good.HostIf},
		{NetNS: "/run/k3sm/netns/a/b", HostIf: good.HostIf},
		{NetNS: "/run/k3sm/netns", HostIf: good.HostIf},
		{NetNS: "netns/abc", HostIf: good.HostIf},
	} {
		if err := d.checkPodNames(p); err == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}

// TestStaleNetNSFile: a namespace file that is no longer a mount (what a
// reboot leaves when the directory survives) gets a fresh namespace.
func TestStaleNetNSFile(t *testing.T) {
	f := newFixture(t)
	f.up()
	if err := unix.Unmount(f.a.NetNS, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if ok, err := isNetNS(f.a.NetNS); err != nil || ok {
		t.Fatalf("isNetNS after unmount = %v, %v", ok, err)
	}
	if err := f.dp.AddPod(testNode, f.a); err != nil {
		t.Fatal(err)
	}
	if ok, _ := isNetNS(f.a.NetNS); !ok {
		t.Fatal("AddPod left the file unmounted")
	}
	sa := serve(t, f.a.NetNS, 8080)
	if src := sa.reach(t, f.b.NetNS, at(f.a.IP)); src != f.b.IP {
		t.Errorf("B → A in its new namespace arrived from %v", src)
	}
}

// The Service range is local to the node (a pod reaches a ClusterIP
// listener of the node through its default route, with its own address),
// the rest of the cluster range is refused on the node, and both routes go
// with DelNode.
func TestServiceAndClusterRanges(t *testing.T) {
	f := newFixture(t)
	n := testNode
	n.ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	n.ClusterCIDR = netip.MustParsePrefix("100.64.0.0/10")
	ready := func() bool {
		inv, err := f.dp.Inventory(n)
		if err != nil {
			t.Fatal(err)
		}
		return inv.NodeReady
	}
	if err := f.dp.EnsureNode(n); err != nil {
		t.Fatal(err)
	}
	if err := f.dp.AddPod(n, f.a); err != nil {
		t.Fatal(err)
	}
	// Any Service address is the node's: a listener on the wildcard
	// answers a ClusterIP, and sees the pod's own address.
	svc := serve(t, f.hostNS, 8080)
	if got := svc.reach(t, f.a.NetNS, at(netip.MustParseAddr("10.96.0.10"))); got != f.a.IP {
		t.Fatalf("the node saw the pod's ClusterIP connection from %v, want %v", got, f.a.IP)
	}
	// Another node's pod address that nobody routes: refused at once
	// (unreachable), never sent on.
	start := time.Now()
	err := connect(t, f.a.NetNS, at(netip.MustParseAddr("100.65.0.9")), 3*time.Second)
	if err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("connect to an unrouted cluster address: %v after %v, want an immediate unreachable", err, time.Since(start))
	}
	if !ready() {
		t.Fatal("NodeReady false with both routes present")
	}
	h := f.handle(f.hostNS)
	defer h.Close()
	rs, err := rangeRoutes(h, n)
	if err != nil || len(rs) != 2 {
		t.Fatalf("routes %v %v", rs, err)
	}
	if err := h.RouteDel(rs[0]); err != nil {
		t.Fatal(err)
	}
	if ready() {
		t.Fatal("NodeReady true without the Service route")
	}
	if err := f.dp.EnsureNode(n); err != nil || !ready() {
		t.Fatalf("EnsureNode did not restore the Service route: %v", err)
	}
	if err := f.dp.DelNode(n); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if ok, err := hasRoute(h, r); err != nil || ok {
			t.Fatalf("route %v after DelNode: present=%v %v", r.Dst, ok, err)
		}
	}
}

// The bridge keeps one address whatever ports come and go: a bridge that
// follows its ports' smallest MAC would stale every pod's ARP entry for the
// gateway when a pod with a smaller MAC leaves.
func TestBridgeMACStable(t *testing.T) {
	f := newFixture(t)
	f.up()
	want := bridgeMAC(testNode.Gateway)
	mac := func() string { return f.link(f.hostNS, "k3sm0").Attrs().HardwareAddr.String() }
	if got := mac(); got != want.String() {
		t.Fatalf("bridge MAC %s, want %s", got, want)
	}
	if err := f.dp.DelPod(f.a); err != nil {
		t.Fatal(err)
	}
	if err := f.dp.DelPod(f.b); err != nil {
		t.Fatal(err)
	}
	if got := mac(); got != want.String() {
		t.Fatalf("bridge MAC after its ports left: %s, want %s", got, want)
	}
	f.up()
	if got := mac(); got != want.String() {
		t.Fatalf("bridge MAC with new ports: %s, want %s", got, want)
	}
}
