//go:build linux

package nodeproc

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// routeCollision reports a route of the machine (other than the pod
// network's own) that overlaps one of ranges: 100.64.0.0/10 is also
// Tailscale's and carrier-grade NAT's, and pods given such addresses would
// shadow, or be shadowed by, the machine's real network.
func RouteCollision(ranges map[string]netip.Prefix, ownLink string) error {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil // cannot tell: netd's own checks still apply
	}
	names := map[int]string{}
	for _, r := range routes {
		if r.Dst == nil || r.Type == unix.RTN_UNREACHABLE || r.Type == unix.RTN_BROADCAST || r.Protocol == unix.RTPROT_STATIC && r.Type == unix.RTN_LOCAL {
			continue // default routes, netd's unreachable and local ranges
		}
		dst, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		p := netip.PrefixFrom(dst.Unmap(), ones)
		// netlink reports a default route as 0.0.0.0/0 rather than
		// without a destination on some kernels: it overlaps every range.
		if p.Addr().IsLoopback() || ones == 0 {
			continue
		}
		if _, ok := names[r.LinkIndex]; !ok {
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				names[r.LinkIndex] = l.Attrs().Name
			}
		}
		dev := names[r.LinkIndex]
		if dev == ownLink {
			continue
		}
		for flag, want := range ranges {
			if want.Overlaps(p) {
				return fmt.Errorf("--%s %s overlaps this machine's route to %s (dev %s): pods would shadow that network or be shadowed by it; choose another range with --%s", flag, want, p, dev, flag)
			}
		}
	}
	return nil
}
