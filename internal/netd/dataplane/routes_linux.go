//go:build linux

package dataplane

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// rangeRoutes are the node's routes for the Service and cluster ranges: the
// Service range local (table local, on lo: any ClusterIP is an address of
// the node), the cluster range unreachable (main table; this node's /24 on
// the bridge is more specific).
func rangeRoutes(h *netlink.Handle, n Node) ([]*netlink.Route, error) {
	var out []*netlink.Route
	if n.ServiceCIDR.IsValid() {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return nil, fmt.Errorf("dataplane: lo: %w", err)
		}
		out = append(out, &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: ipNet(n.ServiceCIDR), Type: unix.RTN_LOCAL,
			Table: unix.RT_TABLE_LOCAL, Scope: netlink.SCOPE_HOST, Protocol: unix.RTPROT_STATIC})
	}
	if n.ClusterCIDR.IsValid() && n.ClusterCIDR != n.CIDR {
		out = append(out, &netlink.Route{Dst: ipNet(n.ClusterCIDR), Type: unix.RTN_UNREACHABLE,
			Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_STATIC})
	}
	return out, nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// hasRoute reports whether r exists (same table, type and destination).
func hasRoute(h *netlink.Handle, r *netlink.Route) (bool, error) {
	got, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: r.Table, Dst: r.Dst},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
	if err != nil {
		return false, fmt.Errorf("dataplane: list routes: %w", err)
	}
	for _, g := range got {
		if g.Type == r.Type && (r.LinkIndex == 0 || g.LinkIndex == r.LinkIndex) {
			return true, nil
		}
	}
	return false, nil
}

func ensureRangeRoutes(h *netlink.Handle, n Node) error {
	rs, err := rangeRoutes(h, n)
	if err != nil {
		return err
	}
	for _, r := range rs {
		ok, err := hasRoute(h, r)
		if err != nil {
			return err
		}
		if ok {
			continue // unchanged: no churn on a healthy node
		}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("dataplane: route %v (type %d): %w", r.Dst, r.Type, err)
		}
	}
	return nil
}

func rangeRoutesReady(h *netlink.Handle, n Node) (bool, error) {
	rs, err := rangeRoutes(h, n)
	if err != nil {
		return false, err
	}
	for _, r := range rs {
		if ok, err := hasRoute(h, r); err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

func delRangeRoutes(h *netlink.Handle, n Node) error {
	rs, err := rangeRoutes(h, n)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if err := h.RouteDel(r); err != nil && !isNotFound(err) && err != unix.ESRCH {
			return fmt.Errorf("dataplane: remove route %v: %w", r.Dst, err)
		}
	}
	return nil
}
