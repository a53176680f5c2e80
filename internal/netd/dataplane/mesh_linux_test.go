package dataplane

import (
	"crypto/ecdh"
	"crypto/rand"
	"errors"
	"net"
	"net/netip"
	"os"
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

// meshNode is one node of the mesh test: a fixture (its own host
// namespace and dataplane) with a node range of its own and one pod.
type meshNode struct {
	*fixture
	node Node
	pod  Pod
	mesh Mesh
	pub  [32]byte
	wan  netip.Addr // its address on the link between the two hosts
}

func newMeshNode(t *testing.T, cidr string, wan netip.Addr) *meshNode {
	t.Helper()
	f := newFixture(t)
	p := netip.MustParsePrefix(cidr)
	m := &meshNode{fixture: f, wan: wan, node: Node{CIDR: p, Gateway: p.Addr().Next(), Bridge: "k3sm0",
		ClusterCIDR: netip.MustParsePrefix("100.64.0.0/16")}}
	uid := "cccc-" + strings.ReplaceAll(p.Addr().String(), ".", "")
	m.pod = Pod{UID: uid, IP: m.node.Gateway.Next(), NetNS: filepath.Join(f.dir, "netns", uid), HostIf: HostIfName(uid)}
	t.Cleanup(func() { removeNetNS(m.pod.NetNS) })
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	m.mesh = Mesh{Device: MeshDevice, PrivateKey: PrivateKey(priv.Bytes()), ListenPort: 51820, MTU: 1380}
	m.pub = [32]byte(priv.PublicKey().Bytes())
	return m
}

func (m *meshNode) up() {
	m.t.Helper()
	if err := m.dp.EnsureNode(m.node); err != nil {
		m.t.Fatalf("EnsureNode: %v", err)
	}
	if err := m.dp.AddPod(m.node, m.pod); err != nil {
		m.t.Fatalf("AddPod: %v", err)
	}
	if _, err := m.mp().EnsureMesh(m.node, m.mesh); err != nil {
		if errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "/dev/net/tun") {
			m.t.Skipf("no TUN device here: %v", err)
		}
		m.t.Fatalf("EnsureMesh: %v", err)
	}
}

func (m *meshNode) mp() MeshPlane { return m.dp.(MeshPlane) }

func (m *meshNode) peer() MeshPeer {
	return MeshPeer{PublicKey: m.pub, Endpoint: netip.AddrPortFrom(m.wan, m.mesh.ListenPort), CIDR: m.node.CIDR, Keepalive: 25 * time.Second}
}

func (m *meshNode) setPeers(peers ...MeshPeer) {
	m.t.Helper()
	if err := m.mp().SetMeshPeers(m.node, m.mesh, peers); err != nil {
		m.t.Fatalf("SetMeshPeers: %v", err)
	}
}

// meshRoutes are the static routes of the mesh device.
func (m *meshNode) meshRoutes() []netip.Prefix {
	m.t.Helper()
	h := m.handle(m.hostNS)
	l := m.link(m.hostNS, MeshDevice)
	rs, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: l.Attrs().Index, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		m.t.Fatal(err)
	}
	var out []netip.Prefix
	for _, r := range rs {
		if r.Protocol == unix.RTPROT_STATIC {
			if !r.Src.Equal(m.node.Gateway.AsSlice()) {
				m.t.Errorf("route %v via %s has source %v, want the gateway %v", r.Dst, MeshDevice, r.Src, m.node.Gateway)
			}
			out = append(out, prefixOf(r.Dst))
		}
	}
	return out
}

func (m *meshNode) waitHandshake() {
	m.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := m.mp().MeshStatus()
		if err != nil {
			m.t.Fatal(err)
		}
		if len(st) == 1 && !st[0].LastHandshake.IsZero() {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("no handshake after 20 s: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wanLink joins two host namespaces by a veth, wan0 on each side.
func wanLink(t *testing.T, a, b *meshNode) {
	t.Helper()
	nsB, err := netns.GetFromPath(b.hostNS)
	if err != nil {
		t.Fatal(err)
	}
	defer nsB.Close()
	la := netlink.NewLinkAttrs()
	la.Name = "wan0"
	if err := a.handle(a.hostNS).LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "wan0", PeerNamespace: netlink.NsFd(nsB)}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*meshNode{a, b} {
		h := m.handle(m.hostNS)
		l := m.link(m.hostNS, "wan0")
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(m.wan, 24))}); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
}

// mssServer accepts on port in a namespace and reports each client's
// source address and the MSS the connection settled on.
type mssServer struct {
	ln    net.Listener
	conns chan [2]any // netip.Addr, int
}

func serveMSS(t *testing.T, nsPath string, port int) *mssServer {
	t.Helper()
	s := &mssServer{conns: make(chan [2]any, 8)}
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
			s.conns <- [2]any{c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap(), tcpMSS(c)}
			c.Close()
		}
	}()
	return s
}

func tcpMSS(c net.Conn) int {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return -1
	}
	mss := -1
	raw.Control(func(fd uintptr) { mss, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) })
	return mss
}

// reach dials to from nsPath (from the address from, when valid) and
// returns the source the server saw and the MSS of both ends.
func (s *mssServer) reach(t *testing.T, nsPath string, from netip.Addr, to netip.AddrPort) (src netip.Addr, serverMSS, clientMSS int) {
	t.Helper()
	in(t, nsPath, func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		if from.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
		}
		c, err := d.Dial("tcp4", to.String())
		if err != nil {
			return err
		}
		clientMSS = tcpMSS(c)
		return c.Close()
	})
	select {
	case got := <-s.conns:
		return got[0].(netip.Addr), got[1].(int), clientMSS
	case <-time.After(3 * time.Second):
		t.Fatalf("%s → %v: connected, but the server saw no client", filepath.Base(nsPath), to)
		return
	}
}

// TestMesh: two nodes, each a host namespace with a Docker-style drop
// chain, joined by a veth. Their pods reach each other across the mesh
// with their own addresses, the hosts reach the other node's pods from
// their gateway (also when a host process picks another source: SNAT),
// TCP settles on an MSS that fits the device, the status shows a
// handshake, a removed peer takes its route along, and DelMesh leaves
// nothing behind.
func TestMesh(t *testing.T) {
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no /dev/net/tun: %v", err)
	}
	a := newMeshNode(t, "100.64.0.0/24", netip.MustParseAddr("10.99.0.1"))
	b := newMeshNode(t, "100.64.1.0/24", netip.MustParseAddr("10.99.0.2"))
	wanLink(t, a, b)
	for _, m := range []*meshNode{a, b} {
		m.dockerChain()
		m.up()
		t.Cleanup(func() { m.mp().DelMesh(m.node) })
	}
	// One end starts the handshake: two crossing handshakes (both ends
	// sending their first keepalive at once) can leave wireguard-go with
	// a session only one side can use until it rekeys, 15 s later. B's
	// keepalive comes after, through the session (SetMeshPeers changes
	// only what differs).
	quiet := a.peer()
	quiet.Keepalive = 0
	b.setPeers(quiet)
	a.setPeers(b.peer())
	for _, m := range []*meshNode{a, b} {
		m.waitHandshake()
	}
	b.setPeers(a.peer())

	wg := a.link(a.hostNS, MeshDevice)
	if wg.Attrs().MTU != 1380 || wg.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s: MTU %d, flags %v; want 1380, up", MeshDevice, wg.Attrs().MTU, wg.Attrs().Flags)
	}
	addrs, err := a.handle(a.hostNS).AddrList(wg, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || prefixOf(addrs[0].IPNet) != netip.PrefixFrom(a.node.Gateway, 32) {
		t.Errorf("%s addresses %v %v, want only %v/32", MeshDevice, addrs, err, a.node.Gateway)
	}
	if got := a.meshRoutes(); !slices.Equal(got, []netip.Prefix{b.node.CIDR}) {
		t.Errorf("routes via %s: %v, want %v", MeshDevice, got, b.node.CIDR)
	}
	if inv := a.inventoryOf(a.node); !inv.NodeReady {
		t.Error("the node is not ready with the mesh up (its FORWARD accept must not look like a stray copy of the node's)")
	}
	// After our node accepts, before anything that drops.
	if fwd := a.rules("filter", "FORWARD"); len(fwd) != 3 || exprSig(fwd[2].Exprs) != exprSig(meshForwardRule(a.node, MeshDevice)) {
		t.Errorf("ip filter FORWARD has %d rules, want the node's two and the mesh accept third", len(fwd))
	}

	srvB := serveMSS(t, b.pod.NetNS, 8080)
	to := netip.AddrPortFrom(b.pod.IP, 8080)
	src, sMSS, cMSS := srvB.reach(t, a.pod.NetNS, netip.Addr{}, to)
	if src != a.pod.IP {
		t.Errorf("pod A → pod B arrived from %v, want pod A's own %v (no NAT across the mesh)", src, a.pod.IP)
	}
	// 1380 less 40 bytes of headers, less 12 of timestamps when used:
	// clamped on the way out of each node, not 1460 from the pods' eth0.
	if sMSS > 1340 || cMSS > 1340 || sMSS < 1200 || cMSS < 1200 {
		t.Errorf("MSS pod B %d, pod A %d; want at most 1340 (the mesh MTU's)", sMSS, cMSS)
	}
	t.Logf("MSS across the mesh: pod B %d, pod A %d", sMSS, cMSS)
	if src, _, _ := srvB.reach(t, a.hostNS, netip.Addr{}, to); src != a.node.Gateway {
		t.Errorf("host A → pod B arrived from %v, want A's gateway %v (the route's source)", src, a.node.Gateway)
	}
	if src, _, _ := srvB.reach(t, a.hostNS, a.wan, to); src != a.node.Gateway {
		t.Errorf("host A from %v → pod B arrived from %v, want A's gateway %v (SNAT)", a.wan, src, a.node.Gateway)
	}
	srvA := serveMSS(t, a.pod.NetNS, 8080)
	if src, _, _ := srvA.reach(t, b.pod.NetNS, netip.Addr{}, netip.AddrPortFrom(a.pod.IP, 8080)); src != b.pod.IP {
		t.Errorf("pod B → pod A arrived from %v, want %v", src, b.pod.IP)
	}

	st, err := a.mp().MeshStatus()
	if err != nil || len(st) != 1 {
		t.Fatalf("MeshStatus: %+v %v", st, err)
	}
	if p := st[0]; p.PublicKey != b.pub || p.Endpoint != b.peer().Endpoint || p.LastHandshake.IsZero() || p.RxBytes == 0 || p.TxBytes == 0 ||
		time.Since(p.LastHandshake) > time.Minute {
		t.Errorf("MeshStatus peer %+v, want B's key and endpoint, a recent handshake, traffic", p)
	}

	// Again: nothing changes, and the tunnel keeps working.
	idx := wg.Attrs().Index
	if _, err := a.mp().EnsureMesh(a.node, a.mesh); err != nil {
		t.Fatal(err)
	}
	a.setPeers(b.peer())
	if got := a.link(a.hostNS, MeshDevice).Attrs().Index; got != idx {
		t.Errorf("EnsureMesh again made a new link (%d, was %d)", got, idx)
	}
	if fwd := a.rules("filter", "FORWARD"); len(fwd) != 3 {
		t.Errorf("ip filter FORWARD has %d rules after EnsureMesh again, want 3", len(fwd))
	}
	if src, _, _ := srvB.reach(t, a.pod.NetNS, netip.Addr{}, to); src != a.pod.IP {
		t.Errorf("again: pod A → pod B arrived from %v", src)
	}

	// The peer goes, and its route with it: B's range is refused again.
	a.setPeers()
	if got := a.meshRoutes(); len(got) != 0 {
		t.Errorf("routes via %s after removing the peer: %v", MeshDevice, got)
	}
	if st, err := a.mp().MeshStatus(); err != nil || len(st) != 0 {
		t.Errorf("MeshStatus after removing the peer: %+v %v", st, err)
	}
	if err := connect(t, a.pod.NetNS, to, time.Second); err == nil {
		t.Error("pod A still reaches pod B with the peer removed")
	}

	if err := a.mp().DelMesh(a.node); err != nil {
		t.Fatal(err)
	}
	if _, err := a.handle(a.hostNS).LinkByName(MeshDevice); !isNotFound(err) {
		t.Errorf("%s after DelMesh: %v", MeshDevice, err)
	}
	tables, err := a.nft().ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == meshTable }) {
		t.Errorf("table ip %s after DelMesh", meshTable)
	}
	if fwd := a.rules("filter", "FORWARD"); len(fwd) != 2 {
		t.Errorf("ip filter FORWARD has %d rules after DelMesh, want the node's two", len(fwd))
	}
	if err := a.mp().DelMesh(a.node); err != nil {
		t.Errorf("DelMesh again: %v", err)
	}
	if st, err := a.mp().MeshStatus(); st != nil || err != nil {
		t.Errorf("MeshStatus without a device: %+v %v", st, err)
	}
	// The node's own network is untouched.
	if inv := a.inventoryOf(a.node); !inv.NodeReady {
		t.Error("the node is not ready after DelMesh")
	}
}

func (f *fixture) inventoryOf(n Node) Inventory {
	f.t.Helper()
	inv, err := f.dp.Inventory(n)
	if err != nil {
		f.t.Fatal(err)
	}
	return inv
}

// A link of the mesh device's name that this process did not make is
// left alone, and SetMeshPeers without a device is refused.
func TestMeshRefuses(t *testing.T) {
	m := newMeshNode(t, "100.64.0.0/24", netip.MustParseAddr("10.99.0.1"))
	if err := m.dp.EnsureNode(m.node); err != nil {
		t.Fatal(err)
	}
	if err := m.mp().SetMeshPeers(m.node, m.mesh, nil); err == nil {
		t.Error("SetMeshPeers without a device succeeded")
	}
	la := netlink.NewLinkAttrs()
	la.Name = MeshDevice
	if err := m.handle(m.hostNS).LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.mp().EnsureMesh(m.node, m.mesh); err == nil || !strings.Contains(err.Error(), "did not make") {
		t.Errorf("EnsureMesh over a bridge %s: %v", MeshDevice, err)
	}
	if err := m.mp().DelMesh(m.node); err != nil {
		t.Fatal(err)
	}
	if l := m.link(m.hostNS, MeshDevice); l.Type() != "bridge" {
		t.Errorf("DelMesh touched a link it did not make: %s", l.Type())
	}
	for _, bad := range []Mesh{{ListenPort: 0, MTU: 1380}, {ListenPort: 1, MTU: 100}, {Device: "k3v0", ListenPort: 1, MTU: 1380}} {
		if _, err := m.mp().EnsureMesh(m.node, bad); err == nil {
			t.Errorf("EnsureMesh(%+v) succeeded", bad)
		}
	}
	overlap := MeshPeer{Endpoint: netip.MustParseAddrPort("10.99.0.2:1"), CIDR: netip.MustParsePrefix("100.64.0.0/16")}
	if err := CheckMeshPeers(m.node, []MeshPeer{overlap}); err == nil {
		t.Error("a peer overlapping the node's range was accepted")
	}
}
