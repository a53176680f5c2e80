package dataplane

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
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
	if !ip.Is4() || !n.CIDR.Contains(ip) || ip == n.CIDR.Addr() || ip == n.Gateway || ip == Broadcast(n.CIDR) {
		return fmt.Errorf("dataplane: pod address %v is not a free host address of %v", ip, n.CIDR)
	}
	return nil
}

// Broadcast is the last address of an IPv4 prefix.
func Broadcast(p netip.Prefix) netip.Addr { return numAddr(prefixRange(p).hi) }

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

// checkPolicy refuses a policy the rules could not express exactly:
// IPv4 masked ranges whose exceptions lie inside them, known protocols,
// port ranges that run forward, and rules only where a side is isolated.
func checkPolicy(pol Policy) error {
	for _, d := range []struct {
		name string
		d    Direction
	}{{"ingress", pol.Ingress}, {"egress", pol.Egress}} {
		if !d.d.Isolated && len(d.d.Rules) > 0 {
			return fmt.Errorf("dataplane: %s has rules but is not isolated", d.name)
		}
		for _, r := range d.d.Rules {
			for _, p := range r.Peers {
				if !p.CIDR.IsValid() || !p.CIDR.Addr().Is4() || p.CIDR != p.CIDR.Masked() {
					return fmt.Errorf("dataplane: %s peer %v: need a masked IPv4 prefix", d.name, p.CIDR)
				}
				for _, e := range p.Except {
					if !e.IsValid() || !e.Addr().Is4() || e != e.Masked() || e.Bits() < p.CIDR.Bits() || !p.CIDR.Contains(e.Addr()) {
						return fmt.Errorf("dataplane: %s peer %v: except %v is not a masked IPv4 prefix inside it", d.name, p.CIDR, e)
					}
				}
			}
			for _, p := range r.Ports {
				switch p.Protocol {
				case TCP, UDP, SCTP:
				default:
					return fmt.Errorf("dataplane: %s port: protocol %d is not TCP, UDP or SCTP", d.name, p.Protocol)
				}
				if p.EndPort != 0 && (p.Port == 0 || p.EndPort < p.Port) {
					return fmt.Errorf("dataplane: %s port range %d-%d", d.name, p.Port, p.EndPort)
				}
			}
		}
	}
	return nil
}

// addrRange is an inclusive range of IPv4 addresses as numbers.
type addrRange struct{ lo, hi uint32 }

func addrNum(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func numAddr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func prefixRange(p netip.Prefix) addrRange {
	lo := addrNum(p.Masked().Addr())
	return addrRange{lo, lo | (uint32(1)<<(32-p.Bits()) - 1)}
}

// peerRanges is the union of the peers less their exceptions, as sorted,
// disjoint, non-adjacent ranges: an interval set refuses overlapping
// elements, and peers of several selectors overlap freely.
func peerRanges(peers []Peer) []addrRange {
	var out []addrRange
	for _, p := range peers {
		parts := []addrRange{prefixRange(p.CIDR)}
		for _, e := range p.Except {
			x := prefixRange(e)
			var next []addrRange
			for _, r := range parts {
				if x.hi < r.lo || x.lo > r.hi {
					next = append(next, r)
					continue
				}
				if x.lo > r.lo {
					next = append(next, addrRange{r.lo, x.lo - 1})
				}
				if x.hi < r.hi {
					next = append(next, addrRange{x.hi + 1, r.hi})
				}
			}
			parts = next
		}
		out = append(out, parts...)
	}
	return mergeRanges(out)
}

// mergeRanges sorts rs and joins the ranges that overlap or touch.
func mergeRanges(out []addrRange) []addrRange {
	slices.SortFunc(out, func(a, b addrRange) int { return cmp.Compare(a.lo, b.lo) })
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 && (r.lo <= merged[n-1].hi || r.lo == merged[n-1].hi+1) {
			merged[n-1].hi = max(merged[n-1].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

// Bounds of SetServices (the wire protocol's, repeated: the dataplane
// takes no client input but through its own checks).
const (
	maxServices              = 16384
	maxServiceEndpoints      = 1000
	maxServiceEndpointsTotal = 65536
)

// checkServices refuses what would translate traffic it must not: a
// protocol other than TCP or UDP, a ClusterIP outside the Service range
// (when the node has one; an external IP or a node address may be), a
// Local port that is neither or has an endpoint off the node, any Service address
// inside the pod range or not global unicast, a port 0, a Service
// port or an endpoint twice, an endpoint that is not an IPv4 address:port.
func checkServices(n Node, svcs []Service) error {
	if err := checkNode(n); err != nil {
		return err
	}
	if len(svcs) > maxServices {
		return fmt.Errorf("dataplane: %d Service ports, at most %d", len(svcs), maxServices)
	}
	seen := make(map[serviceKey]bool, len(svcs))
	total := 0
	for _, s := range svcs {
		if total += len(s.Endpoints); total > maxServiceEndpointsTotal {
			return fmt.Errorf("dataplane: more than %d Service endpoints in all", maxServiceEndpointsTotal)
		}
		if s.Protocol != TCP && s.Protocol != UDP {
			return fmt.Errorf("dataplane: Service %v: protocol %d is not TCP or UDP", s.IP, s.Protocol)
		}
		if !s.IP.Is4() || s.Port == 0 {
			return fmt.Errorf("dataplane: Service %v port %d: need an IPv4 address and a port", s.IP, s.Port)
		}
		if n.CIDR.Contains(s.IP) || (n.ClusterCIDR.IsValid() && n.ClusterCIDR.Contains(s.IP)) {
			return fmt.Errorf("dataplane: Service %v is inside the pod range", s.IP)
		}
		if s.External && s.OnNode {
			return fmt.Errorf("dataplane: Service %v is both an external IP and a node address", s.IP)
		}
		if n.ServiceCIDR.IsValid() && !n.ServiceCIDR.Contains(s.IP) && !s.External && !s.OnNode {
			return fmt.Errorf("dataplane: Service %v is outside the Service range %v (and not an external IP or a node address)", s.IP, n.ServiceCIDR)
		}
		if s.Local && !s.External && !s.OnNode {
			return fmt.Errorf("dataplane: Service %v: only an external IP or a node address can keep the client's address (Local)", s.IP)
		}
		if !s.IP.IsGlobalUnicast() {
			return fmt.Errorf("dataplane: Service %v is not a unicast address a Service may take (loopback, link-local, multicast, broadcast)", s.IP)
		}
		k := serviceKey{s.Protocol, s.IP, s.Port}
		if seen[k] {
			return fmt.Errorf("dataplane: Service %s twice", k)
		}
		seen[k] = true
		if len(s.Endpoints) > maxServiceEndpoints {
			return fmt.Errorf("dataplane: Service %s: %d endpoints, at most %d", k, len(s.Endpoints), maxServiceEndpoints)
		}
		eps := make(map[netip.AddrPort]bool, len(s.Endpoints))
		for _, e := range s.Endpoints {
			if !e.Addr().Is4() || e.Port() == 0 {
				return fmt.Errorf("dataplane: Service %s: endpoint %v is not an IPv4 address and port", k, e)
			}
			if eps[e] {
				return fmt.Errorf("dataplane: Service %s: endpoint %v twice", k, e)
			}
			if s.Local && !n.CIDR.Contains(e.Addr()) {
				return fmt.Errorf("dataplane: Service %s: endpoint %v is not a pod of this node (%v), and a Local port's replies are not masqueraded", k, e, n.CIDR)
			}
			eps[e] = true
		}
	}
	return nil
}

// serviceKey is what a Service port is looked up by.
type serviceKey struct {
	proto Protocol
	ip    netip.Addr
	port  uint16
}

func (k serviceKey) String() string {
	name := "tcp"
	if k.proto == UDP {
		name = "udp"
	}
	return fmt.Sprintf("%s-%s", netip.AddrPortFrom(k.ip, k.port), name)
}
