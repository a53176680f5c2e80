package dataplane

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
)

// The mesh on Linux: wireguard-go in this process on a TUN link in the
// host namespace. The link lives as long as the process holds the TUN
// descriptor, so a netd restart loses it and the server's resync makes
// it again. Its rules sit in a table of their own, so EnsureNode (which
// replaces table ip k3sm) and DelMesh never touch each other's:
//
//	table ip k3sm-mesh
//	  chain postrouting (nat, srcnat)
//	    oifname k3sm-wg ip saddr != <node CIDR> snat to <gateway>
//	  chain mss (filter, postrouting, mangle)
//	    oifname k3sm-wg tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu
//
// plus `iifname k3sm-wg oifname k3sm0 accept` after our accepts in ip
// filter FORWARD when that chain exists (Docker's policy drop).
const meshTable = "k3sm-mesh"

// meshDev is the process's one mesh device and what was last applied to
// it, so a repeated call changes only what differs: setting a peer's
// endpoint again would undo its roaming, its keepalive again would send
// one at once.
type meshDev struct {
	dev   *device.Device
	name  string
	key   PrivateKey
	port  uint16
	peers map[[32]byte]MeshPeer
}

func (d *linuxPlane) EnsureMesh(n Node, m Mesh) (string, error) {
	if err := checkNode(n); err != nil {
		return "", err
	}
	if err := checkMesh(m); err != nil {
		return "", err
	}
	name := m.Device
	if name == "" {
		name = MeshDevice
	}
	if name == n.Bridge {
		return "", fmt.Errorf("dataplane: mesh device %s is the bridge's name", name)
	}
	d.meshMu.Lock()
	defer d.meshMu.Unlock()
	h, err := d.hostHandle()
	if err != nil {
		return "", err
	}
	defer h.Close()
	if d.mesh != nil {
		// Renamed, or its link deleted by hand: start over (the server
		// sets the peers again after EnsureMesh).
		if _, err := h.LinkByName(d.mesh.name); d.mesh.name != name || isNotFound(err) {
			if err := d.closeMesh(h); err != nil {
				return "", err
			}
		}
	}
	if d.mesh == nil {
		if l, err := h.LinkByName(name); err == nil {
			return "", fmt.Errorf("dataplane: a %s link %s exists that this k3sm-netd did not make; remove it", l.Type(), name)
		}
		if d.mesh, err = d.newMeshDev(name, m.MTU); err != nil {
			return "", err
		}
	}
	md := d.mesh
	if md.key != m.PrivateKey {
		// Set directly, not through IpcSet: no text of the key is made
		// that an error could quote.
		if err := md.dev.SetPrivateKey(device.NoisePrivateKey(m.PrivateKey)); err != nil {
			return "", fmt.Errorf("dataplane: mesh device %s: set its private key failed", name)
		}
		md.key = m.PrivateKey
	}
	if md.port != m.ListenPort {
		// Rebinds at once when the device is up, else Up binds below: on
		// a host thread, where the sockets are to be.
		if err := onThread(d.hostNS, func() error { return md.dev.IpcSet(fmt.Sprintf("listen_port=%d\n", m.ListenPort)) }); err != nil {
			return "", fmt.Errorf("dataplane: mesh device %s: UDP port %d: %w", name, m.ListenPort, err)
		}
		md.port = m.ListenPort
	}
	link, err := h.LinkByName(name)
	if err != nil {
		return "", fmt.Errorf("dataplane: mesh device %s: %w", name, err)
	}
	if link.Attrs().MTU != m.MTU {
		if err := h.LinkSetMTU(link, m.MTU); err != nil {
			return "", fmt.Errorf("dataplane: mesh device %s MTU: %w", name, err)
		}
	}
	// The gateway as a /32: no prefix route, so only the peers' routes
	// lead into the device, and the node's own traffic to them leaves
	// from an address of its range, which the peers allow.
	if err := ensureOnlyAddr(h, link, netip.PrefixFrom(n.Gateway, 32)); err != nil {
		return "", err
	}
	if err := ensureUp(h, link); err != nil {
		return "", err
	}
	// Opens the UDP sockets (see hostTUN); a port in use fails here.
	if err := onThread(d.hostNS, md.dev.Up); err != nil {
		return "", fmt.Errorf("dataplane: mesh device %s up on UDP port %d: %w", name, m.ListenPort, err)
	}
	if err := d.ensureMeshRules(n, name); err != nil {
		return "", err
	}
	return name, nil
}

// newMeshDev creates the TUN link and the device on a thread inside the
// host namespace: the link is made in the namespace of the thread that
// opens /dev/net/tun, and the device's MTU query and the TUN's netlink
// listener are that thread's too.
func (d *linuxPlane) newMeshDev(name string, mtu int) (*meshDev, error) {
	logf := d.log
	if logf == nil {
		logf = slog.New(slog.DiscardHandler)
	}
	logger := &device.Logger{
		Verbosef: device.DiscardLogf,
		Errorf: func(format string, args ...any) {
			logf.Warn("mesh device", "device", name, "err", fmt.Sprintf(format, args...))
		},
	}
	var dev *device.Device
	err := onThread(d.hostNS, func() error {
		t, err := tun.CreateTUN(name, mtu)
		if err != nil {
			return err
		}
		dev = device.NewDevice(newHostTUN(t, d.hostNS), conn.NewDefaultBind(), logger)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dataplane: create the mesh device %s: %w", name, err)
	}
	return &meshDev{dev: dev, name: name, peers: map[[32]byte]MeshPeer{}}, nil
}

// hostTUN keeps wireguard-go from following the link's up and down
// events: it would bring the device up (opening its UDP sockets and route
// listener) from whichever goroutine reads them, on a thread that may not
// be in the host namespace, and it races the up EnsureMesh does (an early
// down event closing the sockets just opened). netd brings the device up
// itself, on a host thread, and keeps it up until DelMesh. The MTU is
// read on a host thread too.
type hostTUN struct {
	tun.Device
	ns     netns.NsHandle
	events chan tun.Event
}

func newHostTUN(t tun.Device, ns netns.NsHandle) *hostTUN {
	h := &hostTUN{Device: t, ns: ns, events: make(chan tun.Event, 4)}
	go func() {
		defer close(h.events)
		for e := range t.Events() {
			if e &^= tun.EventUp | tun.EventDown; e != 0 {
				h.events <- e
			}
		}
	}()
	return h
}

func (h *hostTUN) Events() <-chan tun.Event { return h.events }

func (h *hostTUN) MTU() (mtu int, err error) {
	err = onThread(h.ns, func() error {
		mtu, err = h.Device.MTU()
		return err
	})
	return mtu, err
}

func (d *linuxPlane) SetMeshPeers(n Node, m Mesh, peers []MeshPeer) error {
	if err := checkNode(n); err != nil {
		return err
	}
	if err := CheckMeshPeers(n, peers); err != nil {
		return err
	}
	d.meshMu.Lock()
	defer d.meshMu.Unlock()
	md := d.mesh
	if md == nil {
		return fmt.Errorf("dataplane: no mesh device (EnsureMesh first)")
	}
	uapi, want := meshPeersUAPI(md.peers, peers)
	if uapi != "" {
		if err := md.dev.IpcSet(uapi); err != nil {
			// Partly applied: unknown, so the next call replaces all.
			md.peers = nil
			return fmt.Errorf("dataplane: mesh device %s peers: %w", md.name, err)
		}
	}
	md.peers = want
	h, err := d.hostHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	return ensureMeshRoutes(h, n, md.name, peers)
}

// ensureMeshRoutes routes each peer's range into the device from the
// gateway (more specific than the cluster range's unreachable route) and
// removes the device's other static routes: those of peers gone.
func ensureMeshRoutes(h *netlink.Handle, n Node, name string, peers []MeshPeer) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("dataplane: mesh device %s: %w", name, err)
	}
	idx := link.Attrs().Index
	have, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: idx, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("dataplane: routes of %s: %w", name, err)
	}
	want := map[netip.Prefix]bool{}
	for _, p := range peers {
		want[p.CIDR] = true
	}
	ok := map[netip.Prefix]bool{}
	for _, r := range have {
		dst := prefixOf(r.Dst)
		switch {
		case r.Protocol != unix.RTPROT_STATIC:
			// The kernel's own (none for a /32 address) or not ours.
		case want[dst] && r.Src.Equal(n.Gateway.AsSlice()) && r.Type == unix.RTN_UNICAST:
			ok[dst] = true
		default:
			if err := h.RouteDel(&r); err != nil && !isNotFound(err) && err != unix.ESRCH {
				return fmt.Errorf("dataplane: remove route %v from %s: %w", dst, name, err)
			}
		}
	}
	for _, p := range peers {
		if ok[p.CIDR] {
			continue
		}
		r := &netlink.Route{LinkIndex: idx, Dst: ipNet(p.CIDR), Src: n.Gateway.AsSlice(), Scope: netlink.SCOPE_LINK,
			Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_STATIC, Type: unix.RTN_UNICAST}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("dataplane: route %v via %s: %w", p.CIDR, name, err)
		}
	}
	return nil
}

func (d *linuxPlane) MeshStatus() ([]MeshPeerStatus, error) {
	d.meshMu.Lock()
	defer d.meshMu.Unlock()
	if d.mesh == nil {
		return nil, nil
	}
	var buf bytes.Buffer
	// The text starts with the private key: parsed here and wiped, never
	// kept or quoted.
	defer func() { b := buf.Bytes(); clear(b[:cap(b)]) }()
	err := d.mesh.dev.IpcGetOperation(&buf)
	if err != nil {
		return nil, fmt.Errorf("dataplane: mesh device %s status: %w", d.mesh.name, err)
	}
	return parseMeshStatus(buf.Bytes())
}

func (d *linuxPlane) DelMesh(n Node) error {
	if err := checkNode(n); err != nil {
		return err
	}
	d.meshMu.Lock()
	defer d.meshMu.Unlock()
	h, err := d.hostHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	name := MeshDevice
	if d.mesh != nil {
		name = d.mesh.name
	}
	if err := d.closeMesh(h); err != nil {
		return err
	}
	return d.delMeshRules(n, name)
}

// closeMesh closes the device, which removes its link and with it the
// link's routes, and waits until the link is gone.
func (d *linuxPlane) closeMesh(h *netlink.Handle) error {
	if d.mesh == nil {
		return nil
	}
	name := d.mesh.name
	d.mesh.dev.Close()
	d.mesh = nil
	for range 100 {
		if _, err := h.LinkByName(name); isNotFound(err) {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("dataplane: mesh device %s is still there after closing it", name)
}

func (d *linuxPlane) ensureMeshRules(n Node, dev string) error {
	c, err := d.nftConn()
	if err != nil {
		return err
	}
	t := freshTable(c, &nftables.Table{Family: nftables.TableFamilyIPv4, Name: meshTable})
	nat := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: meshSNATExprs(n, dev)})
	mss := c.AddChain(&nftables.Chain{Name: "mss", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityMangle})
	c.AddRule(&nftables.Rule{Table: t, Chain: mss, Exprs: meshMSSExprs(dev)})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: nftables table ip %s: %w", meshTable, err)
	}

	fwd, err := findForward(c)
	if err != nil || fwd == nil {
		return err
	}
	rules, err := c.GetRules(fwd.Table, fwd)
	if err != nil {
		return fmt.Errorf("dataplane: list ip filter FORWARD: %w", err)
	}
	want := meshForwardRule(n, dev)
	// Right after our node accepts (EnsureNode keeps those at the head),
	// before whatever drops.
	at := 0
	if base := forwardRules(n); forwardAtHead(rules, base) {
		at = len(base)
	}
	copies := 0
	for _, r := range rules {
		if isOurs(r, [][]expr.Any{want}) {
			copies++
		}
	}
	if copies == 1 && at < len(rules) && isOurs(rules[at], [][]expr.Any{want}) {
		return nil
	}
	for _, r := range rules {
		if isOurs(r, [][]expr.Any{want}) {
			if err := c.DelRule(r); err != nil {
				return fmt.Errorf("dataplane: ip filter FORWARD: %w", err)
			}
		}
	}
	if at == 0 {
		c.InsertRule(&nftables.Rule{Table: fwd.Table, Chain: fwd, Exprs: want})
	} else {
		c.AddRule(&nftables.Rule{Table: fwd.Table, Chain: fwd, Exprs: want, Position: rules[at-1].Handle})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: accept %s in ip filter FORWARD: %w", dev, err)
	}
	return nil
}

func (d *linuxPlane) delMeshRules(n Node, dev string) error {
	return d.dropTableAndForward(meshTable, [][]expr.Any{meshForwardRule(n, dev)})
}

// meshSNATExprs: oifname <dev> ip saddr != <cidr> counter snat to <gw>.
// What leaves through the mesh from outside the node's range (the host's
// own addresses, a NodePort client after DNAT) takes the gateway's
// address: a peer accepts only sources inside the node's range.
func meshSNATExprs(n Node, dev string) []expr.Any {
	gw := n.Gateway.As4()
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(dev)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(n.CIDR.Bits(), 32), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: n.CIDR.Addr().AsSlice()},
		&expr.Counter{},
		&expr.Immediate{Register: 1, Data: gw[:]},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
}

// TCP header flags as nft matches them.
const (
	tcpFlagSYN = 0x02
	tcpFlagRST = 0x04
	tcpOptMSS  = 2
)

// meshMSSExprs: oifname <dev> tcp flags & (syn|rst) == syn tcp option
// maxseg size set rt mtu, as nft compiles it. A pod's MSS comes from its
// 1500-byte eth0; the device's MTU is lower, and ICMP "fragmentation
// needed" does not always make it back (the kernel lowers, never raises,
// the option).
func meshMSSExprs(dev string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(dev)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{tcpFlagSYN | tcpFlagRST}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{tcpFlagSYN}},
		&expr.Counter{},
		&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
		&expr.Exthdr{SourceRegister: 1, Type: tcpOptMSS, Offset: 2, Len: 2, Op: expr.ExthdrOpTcpopt},
	}
}

// meshForwardRule is iptables-nft's `-i <dev> -o <bridge> -j ACCEPT`:
// peers' pods open connections to this node's pods (replies to ours pass
// by the bridge's accepts).
func meshForwardRule(n Node, dev string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(dev)},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(n.Bridge)},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

var _ MeshPlane = (*linuxPlane)(nil)
