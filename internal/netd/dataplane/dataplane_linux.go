package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// podIfName is the pod end of every veth, inside the pod's namespace.
const podIfName = "eth0"

// defaultMTU is the MTU of the bridge and the veths when Options.MTU is 0.
const defaultMTU = 1500

type linuxPlane struct {
	hostNS   netns.NsHandle // held open for the life of the dataplane
	netnsDir string
	mtu      int

	svcMu      sync.Mutex
	svcApplied [32]byte // digest of the Services set in the kernel (zero: none known)

	log    *slog.Logger // the mesh device's errors
	meshMu sync.Mutex
	mesh   *meshDev // nil: none
}

// New returns the Linux dataplane: netlink handles bound to the host and
// pod namespaces, and nftables over a netlink socket in the host namespace.
func New(o Options) (Dataplane, error) {
	if o.NetNSDir == "" || !filepath.IsAbs(o.NetNSDir) {
		return nil, fmt.Errorf("dataplane: NetNSDir %q must be an absolute directory", o.NetNSDir)
	}
	mtu := o.MTU
	if mtu == 0 {
		mtu = defaultMTU
	}
	if mtu < 576 || mtu > 65535 {
		return nil, fmt.Errorf("dataplane: MTU %d out of range", mtu)
	}
	var ns netns.NsHandle
	var err error
	if o.HostNSPath == "" {
		ns, err = netns.Get()
	} else {
		ns, err = netns.GetFromPath(o.HostNSPath)
	}
	if err != nil {
		return nil, fmt.Errorf("dataplane: host network namespace: %w", err)
	}
	return &linuxPlane{hostNS: ns, netnsDir: filepath.Clean(o.NetNSDir), mtu: mtu, log: o.Logger}, nil
}

func (d *linuxPlane) hostHandle() (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(d.hostNS)
	if err != nil {
		return nil, fmt.Errorf("dataplane: netlink in the host namespace: %w", err)
	}
	return h, nil
}

func (d *linuxPlane) EnsureNode(n Node) error {
	if err := checkNode(n); err != nil {
		return err
	}
	h, err := d.hostHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	if _, err := d.ensureBridge(h, n); err != nil {
		return err
	}
	// /proc/sys/net is resolved against the opening thread's namespace,
	// so the write happens on a thread inside the host namespace.
	if err := onThread(d.hostNS, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644)
	}); err != nil {
		return fmt.Errorf("dataplane: enable IPv4 forwarding: %w", err)
	}
	if err := ensureRangeRoutes(h, n); err != nil {
		return err
	}
	return d.ensureRules(n)
}

// ensureBridge creates the bridge or brings an existing one to the wanted
// state, touching only what differs so that a healthy node never flaps.
func (d *linuxPlane) ensureBridge(h *netlink.Handle, n Node) (netlink.Link, error) {
	br, err := h.LinkByName(n.Bridge)
	if err != nil && !isNotFound(err) {
		return nil, fmt.Errorf("dataplane: bridge %s: %w", n.Bridge, err)
	}
	if br == nil {
		la := netlink.NewLinkAttrs()
		la.Name = n.Bridge
		la.MTU = d.mtu
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
			return nil, fmt.Errorf("dataplane: create bridge %s: %w", n.Bridge, err)
		}
		if br, err = h.LinkByName(n.Bridge); err != nil {
			return nil, fmt.Errorf("dataplane: bridge %s: %w", n.Bridge, err)
		}
	}
	if br.Type() != "bridge" {
		return nil, fmt.Errorf("dataplane: %s exists and is a %s, not a bridge", n.Bridge, br.Type())
	}
	// Set explicitly: a bridge otherwise follows the smallest MTU among its
	// ports, and the first pod would decide it.
	if br.Attrs().MTU != d.mtu {
		if err := h.LinkSetMTU(br, d.mtu); err != nil {
			return nil, fmt.Errorf("dataplane: bridge %s MTU: %w", n.Bridge, err)
		}
	}
	// Set explicitly too: a bridge otherwise takes the smallest MAC of its
	// ports and changes it as pods come and go, and every pod's ARP entry
	// for the gateway goes stale with it (traffic to the node stalls).
	if mac := bridgeMAC(n.Gateway); !bytes.Equal(br.Attrs().HardwareAddr, mac) {
		if err := h.LinkSetHardwareAddr(br, mac); err != nil {
			return nil, fmt.Errorf("dataplane: bridge %s address: %w", n.Bridge, err)
		}
	}
	if err := ensureOnlyAddr(h, br, netip.PrefixFrom(n.Gateway, n.CIDR.Bits())); err != nil {
		return nil, err
	}
	if err := ensureUp(h, br); err != nil {
		return nil, err
	}
	return br, nil
}

// bridgeMAC is the bridge's fixed, locally administered address: 02:6b:33
// ("k3") and the gateway's last three bytes, so it is the same after every
// restart and differs between nodes.
func bridgeMAC(gw netip.Addr) net.HardwareAddr {
	b := gw.As4()
	return net.HardwareAddr{0x02, 0x6b, 0x33, b[1], b[2], b[3]}
}

func (d *linuxPlane) AddPod(n Node, p Pod) error {
	if err := checkNode(n); err != nil {
		return err
	}
	if err := checkPodIP(n, p.IP); err != nil {
		return err
	}
	if err := d.checkPodNames(p); err != nil {
		return err
	}
	h, err := d.hostHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	br, err := h.LinkByName(n.Bridge)
	if err != nil {
		return fmt.Errorf("dataplane: bridge %s (EnsureNode first): %w", n.Bridge, err)
	}

	ok, err := isNetNS(p.NetNS)
	if err == nil && !ok {
		// A pin lost with the mount namespace it was made in, while the
		// pod still runs: the same namespace again, never a new one
		// (that would cut the pod's processes off its address).
		ok, err = d.recoverNetNS(h, p)
	}
	if err != nil {
		return err
	}
	switch {
	case ok:
	case p.UserNS == "":
		if err := createNetNS(p.NetNS); err != nil {
			return err
		}
	case p.FromPid <= 0:
		return fmt.Errorf("dataplane: pod %s: its network namespace is gone; its runtime brings a new one (fromPid)", p.UID)
	default:
		if err := adoptNetNS(p.NetNS, p.UserNS, p.FromPid, p.Owner); err != nil {
			return err
		}
	}
	podNS, err := netns.GetFromPath(p.NetNS)
	if err != nil {
		return fmt.Errorf("dataplane: pod network namespace: %w", err)
	}
	defer podNS.Close()
	ph, err := netlink.NewHandleAt(podNS)
	if err != nil {
		return fmt.Errorf("dataplane: netlink in the pod namespace: %w", err)
	}
	defer ph.Close()

	host, peer, err := d.ensureVeth(h, ph, podNS, br, p)
	if err != nil {
		return err
	}
	if host.Attrs().MasterIndex != br.Attrs().Index {
		if err := h.LinkSetMasterByIndex(host, br.Attrs().Index); err != nil {
			return fmt.Errorf("dataplane: attach %s to %s: %w", p.HostIf, n.Bridge, err)
		}
	}
	for _, l := range []struct {
		h    *netlink.Handle
		link netlink.Link
	}{{h, host}, {ph, peer}} {
		if l.link.Attrs().MTU != d.mtu {
			if err := l.h.LinkSetMTU(l.link, d.mtu); err != nil {
				return fmt.Errorf("dataplane: %s MTU: %w", l.link.Attrs().Name, err)
			}
		}
	}
	if err := ensureHairpin(h, host); err != nil {
		return err
	}
	if err := ensureUp(h, host); err != nil {
		return err
	}
	if err := ensureOnlyAddr(ph, peer, netip.PrefixFrom(p.IP, n.CIDR.Bits())); err != nil {
		return err
	}
	if err := ensureUp(ph, peer); err != nil {
		return err
	}
	lo, err := ph.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("dataplane: pod lo: %w", err)
	}
	if err := ensureUp(ph, lo); err != nil {
		return err
	}
	// A container's root binds ports below 1024 (nginx on :80) though it
	// holds no capability over a namespace the host's user namespace owns:
	// containerd and Docker set this in every pod namespace too.
	if err := onThread(podNS, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0\n"), 0o644)
	}); err != nil {
		return fmt.Errorf("dataplane: pod %s: let its processes bind ports below 1024: %w", p.UID, err)
	}
	return ensureDefaultRoute(ph, peer, n.Gateway)
}

// ensureVeth returns the pod's veth pair, keeping it when both ends exist
// and point at each other, and otherwise removing whatever half is left
// and creating the pair again (the pod end directly in the pod namespace,
// so "eth0" never clashes with a host interface).
func (d *linuxPlane) ensureVeth(h, ph *netlink.Handle, podNS netns.NsHandle, br netlink.Link, p Pod) (host, peer netlink.Link, err error) {
	host, err = h.LinkByName(p.HostIf)
	if err != nil && !isNotFound(err) {
		return nil, nil, fmt.Errorf("dataplane: %s: %w", p.HostIf, err)
	}
	peer, err = ph.LinkByName(podIfName)
	if err != nil && !isNotFound(err) {
		return nil, nil, fmt.Errorf("dataplane: pod %s: %w", podIfName, err)
	}
	// IFLA_LINK of a veth is its peer's ifindex (in the peer's namespace).
	if host != nil && peer != nil && host.Type() == "veth" && peer.Type() == "veth" &&
		host.Attrs().ParentIndex == peer.Attrs().Index && peer.Attrs().ParentIndex == host.Attrs().Index {
		return host, peer, nil
	}
	if host != nil {
		if err := h.LinkDel(host); err != nil && !isNotFound(err) {
			return nil, nil, fmt.Errorf("dataplane: remove stale %s: %w", p.HostIf, err)
		}
	}
	if peer, err = ph.LinkByName(podIfName); err == nil {
		if err := ph.LinkDel(peer); err != nil && !isNotFound(err) {
			return nil, nil, fmt.Errorf("dataplane: remove stale pod %s: %w", podIfName, err)
		}
	}
	la := netlink.NewLinkAttrs()
	la.Name = p.HostIf
	la.MTU = d.mtu
	la.MasterIndex = br.Attrs().Index
	veth := &netlink.Veth{LinkAttrs: la, PeerName: podIfName, PeerNamespace: netlink.NsFd(podNS)}
	if err := h.LinkAdd(veth); err != nil {
		return nil, nil, fmt.Errorf("dataplane: create veth %s: %w", p.HostIf, err)
	}
	if host, err = h.LinkByName(p.HostIf); err != nil {
		return nil, nil, fmt.Errorf("dataplane: %s: %w", p.HostIf, err)
	}
	if peer, err = ph.LinkByName(podIfName); err != nil {
		return nil, nil, fmt.Errorf("dataplane: pod %s: %w", podIfName, err)
	}
	return host, peer, nil
}

func (d *linuxPlane) DelPod(p Pod) error {
	if err := d.checkPodNames(p); err != nil {
		return err
	}
	if err := d.delPolicy(p.HostIf); err != nil {
		return err
	}
	h, err := d.hostHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	// Deleting one end of a veth deletes the pair.
	if l, err := h.LinkByName(p.HostIf); err == nil {
		if err := h.LinkDel(l); err != nil && !isNotFound(err) {
			return fmt.Errorf("dataplane: remove %s: %w", p.HostIf, err)
		}
	} else if !isNotFound(err) {
		return fmt.Errorf("dataplane: %s: %w", p.HostIf, err)
	}
	if p.UserNS != "" {
		if err := removeNetNS(p.UserNS); err != nil {
			return err
		}
	}
	return removeNetNS(p.NetNS)
}

func (d *linuxPlane) Inventory(n Node) (Inventory, error) {
	var inv Inventory
	ents, err := os.ReadDir(d.netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return inv, fmt.Errorf("dataplane: %w", err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			inv.NetNS = append(inv.NetNS, filepath.Join(d.netnsDir, e.Name()))
		}
	}
	h, err := d.hostHandle()
	if err != nil {
		return inv, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return inv, fmt.Errorf("dataplane: list links: %w", err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, HostIfPrefix) {
			inv.HostIfs = append(inv.HostIfs, l.Attrs().Name)
		}
	}
	slices.Sort(inv.HostIfs)
	if checkNode(n) != nil {
		return inv, nil // no valid node: nothing of it can be ready
	}
	if inv.NodeReady, err = d.bridgeReady(h, n); err != nil || !inv.NodeReady {
		return inv, err
	}
	if inv.NodeReady, err = rangeRoutesReady(h, n); err != nil || !inv.NodeReady {
		return inv, err
	}
	inv.NodeReady, err = d.rulesReady(n)
	return inv, err
}

func (d *linuxPlane) bridgeReady(h *netlink.Handle, n Node) (bool, error) {
	br, err := h.LinkByName(n.Bridge)
	if isNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("dataplane: bridge %s: %w", n.Bridge, err)
	}
	if br.Type() != "bridge" || br.Attrs().Flags&net.FlagUp == 0 {
		return false, nil
	}
	addrs, err := h.AddrList(br, netlink.FAMILY_V4)
	if err != nil {
		return false, fmt.Errorf("dataplane: %s addresses: %w", n.Bridge, err)
	}
	want := netip.PrefixFrom(n.Gateway, n.CIDR.Bits())
	for _, a := range addrs {
		if prefixOf(a.IPNet) == want {
			return true, nil
		}
	}
	return false, nil
}

func (d *linuxPlane) DelNode(n Node) error {
	if err := checkNode(n); err != nil {
		return err
	}
	h, err := d.hostHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	if br, err := h.LinkByName(n.Bridge); err == nil {
		if br.Type() != "bridge" {
			return fmt.Errorf("dataplane: %s is a %s, not our bridge", n.Bridge, br.Type())
		}
		if err := h.LinkDel(br); err != nil && !isNotFound(err) {
			return fmt.Errorf("dataplane: remove bridge %s: %w", n.Bridge, err)
		}
	} else if !isNotFound(err) {
		return fmt.Errorf("dataplane: bridge %s: %w", n.Bridge, err)
	}
	if err := delRangeRoutes(h, n); err != nil {
		return err
	}
	if err := d.delPolicyTables(); err != nil {
		return err
	}
	if err := d.delServices(); err != nil {
		return err
	}
	return d.delRules(n)
}

// checkPodNames keeps DelPod and AddPod to what is ours: a host link with
// the pod prefix, and a namespace file directly in NetNSDir.
func (d *linuxPlane) checkPodNames(p Pod) error {
	if !strings.HasPrefix(p.HostIf, HostIfPrefix) || len(p.HostIf) > ifNameMax || !isIfName(p.HostIf) {
		return fmt.Errorf("dataplane: host interface %q is not a k3sm pod interface", p.HostIf)
	}
	if !filepath.IsAbs(p.NetNS) || filepath.Clean(p.NetNS) != p.NetNS || filepath.Dir(p.NetNS) != d.netnsDir {
		return fmt.Errorf("dataplane: pod namespace %q is not a file in %s", p.NetNS, d.netnsDir)
	}
	if p.UserNS != "" && p.UserNS != p.NetNS+".user" {
		return fmt.Errorf("dataplane: pod user namespace %q is not %s.user", p.UserNS, p.NetNS)
	}
	return nil
}

// ensureOnlyAddr leaves want as the link's only IPv4 address, adding it
// only when missing so that a correct link keeps its routes untouched.
func ensureOnlyAddr(h *netlink.Handle, l netlink.Link, want netip.Prefix) error {
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("dataplane: %s addresses: %w", l.Attrs().Name, err)
	}
	have := false
	for _, a := range addrs {
		if prefixOf(a.IPNet) == want {
			have = true
			continue
		}
		if err := h.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("dataplane: remove %v from %s: %w", a.IPNet, l.Attrs().Name, err)
		}
	}
	if have {
		return nil
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: want.Addr().AsSlice(), Mask: net.CIDRMask(want.Bits(), 32)}}
	if err := h.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("dataplane: add %v to %s: %w", want, l.Attrs().Name, err)
	}
	return nil
}

// ensureDefaultRoute makes the default route go via gw on l, replacing a
// different one and leaving a matching one alone.
func ensureDefaultRoute(h *netlink.Handle, l netlink.Link, gw netip.Addr) error {
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("dataplane: pod routes: %w", err)
	}
	for _, r := range routes {
		if isDefault(r.Dst) && r.LinkIndex == l.Attrs().Index && r.Gw != nil && r.Gw.Equal(gw.AsSlice()) && r.Table == unix.RT_TABLE_MAIN {
			return nil
		}
	}
	r := &netlink.Route{
		LinkIndex: l.Attrs().Index,
		Dst:       &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Gw:        gw.AsSlice(),
	}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("dataplane: pod default route via %v: %w", gw, err)
	}
	return nil
}

func ensureUp(h *netlink.Handle, l netlink.Link) error {
	if l.Attrs().Flags&net.FlagUp != 0 {
		return nil
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("dataplane: set %s up: %w", l.Attrs().Name, err)
	}
	return nil
}

// isDefault accepts both forms netlink reports a default route in.
func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0 && dst.IP.IsUnspecified()
}

func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return err != nil && (errors.As(err, &nf) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT))
}

// ensureHairpin lets the bridge send a frame back out of the port it came
// in by: a pod reaching itself through a Service comes back that way.
func ensureHairpin(h *netlink.Handle, l netlink.Link) error {
	pi, err := h.LinkGetProtinfo(l)
	if err == nil && pi.Hairpin {
		return nil
	}
	if err := h.LinkSetHairpin(l, true); err != nil {
		return fmt.Errorf("dataplane: hairpin mode on %s: %w", l.Attrs().Name, err)
	}
	return nil
}
