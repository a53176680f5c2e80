package dataplane

import (
	"fmt"
	"net/netip"
)

// ifNameMax is the longest interface name Linux accepts (IFNAMSIZ - 1).
const ifNameMax = 15

// checkNode refuses a node every implementation would misapply: the
// values end up in rules and commands, so they are checked before use.
func checkNode(n Node) error {
	if !n.CIDR.IsValid() || !n.CIDR.Addr().Is4() || n.CIDR.Bits() < 8 || n.CIDR.Bits() > 30 {
		return fmt.Errorf("dataplane: node CIDR %v: need an IPv4 prefix from /8 to /30", n.CIDR)
	}
	if n.CIDR != n.CIDR.Masked() {
		return fmt.Errorf("dataplane: node CIDR %v has host bits set", n.CIDR)
	}
	if !n.Gateway.Is4() || !n.CIDR.Contains(n.Gateway) || n.Gateway == n.CIDR.Addr() {
		return fmt.Errorf("dataplane: gateway %v is not a host address of %v", n.Gateway, n.CIDR)
	}
	if n.Bridge == "" || len(n.Bridge) > ifNameMax || !isIfName(n.Bridge) {
		return fmt.Errorf("dataplane: bridge name %q is not a valid interface name", n.Bridge)
	}
	for _, r := range []struct {
		name string
		p    netip.Prefix
	}{{"service", n.ServiceCIDR}, {"cluster", n.ClusterCIDR}} {
		if !r.p.IsValid() {
			continue
		}
		if !r.p.Addr().Is4() || r.p != r.p.Masked() || r.p.Bits() < 8 {
			return fmt.Errorf("dataplane: %s CIDR %v: need a masked IPv4 prefix of /8 or longer", r.name, r.p)
		}
	}
	if n.ServiceCIDR.IsValid() && (n.ServiceCIDR.Overlaps(n.CIDR) || (n.ClusterCIDR.IsValid() && n.ServiceCIDR.Overlaps(n.ClusterCIDR))) {
		return fmt.Errorf("dataplane: service CIDR %v overlaps the pod ranges", n.ServiceCIDR)
	}
	if n.ClusterCIDR.IsValid() && (!n.ClusterCIDR.Contains(n.CIDR.Addr()) || n.ClusterCIDR.Bits() > n.CIDR.Bits()) {
		return fmt.Errorf("dataplane: node CIDR %v is not inside the cluster CIDR %v", n.CIDR, n.ClusterCIDR)
	}
	return nil
}

// checkPodIP refuses an address outside the node's range, or one that is
// the network, the gateway or the broadcast address.
func checkPodIP(n Node, ip netip.Addr) error {
	if !ip.Is4() || !n.CIDR.Contains(ip) || ip == n.CIDR.Addr() || ip == n.Gateway || ip == broadcast(n.CIDR) {
		return fmt.Errorf("dataplane: pod address %v is not a free host address of %v", ip, n.CIDR)
	}
	return nil
}

// broadcast is the last address of an IPv4 prefix.
func broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// isIfName accepts the characters k3sm puts in interface names; anything
// else (slashes, spaces, dots) is refused rather than passed to the kernel.
func isIfName(s string) bool {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
