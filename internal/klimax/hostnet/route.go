package hostnet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// RouteStatus is the host's route for the bridge CIDR as found.
type RouteStatus struct {
	CIDR      netip.Prefix `json:"cidr"`
	Present   bool         `json:"present"` // a route for exactly CIDR exists
	Gateway   netip.Addr   `json:"gateway,omitzero"`
	Interface string       `json:"interface,omitempty"`
	Correct   bool         `json:"correct"` // present with the wanted gateway
}

// Exec runs a host command and returns its stdout.
type Exec func(ctx context.Context, argv []string) ([]byte, error)

// LocalExec runs commands on this machine with a timeout.
func LocalExec(ctx context.Context, argv []string) ([]byte, error) {
	r, err := vm.NewHost().Run(ctx, argv, vm.RunOptions{Timeout: time.Minute})
	return r.Stdout, err
}

// Style selects the routing tool dialect.
type Style int

const (
	BSD      Style = iota // macOS route(8)
	IPRoute2              // Linux ip(8)
)

// Router reads and changes the host route for the bridge CIDR.
type Router struct {
	Style Style
	Exec  Exec
	// Sudo prefixes changing commands with `sudo` (macOS; Linux when not root).
	Sudo bool
	// Prefix is prepended to every command (tests: `ip netns exec <ns>`).
	Prefix []string
}

// NewRouter returns the router for this OS (see route_<os>.go).
func NewRouter() *Router { return newRouter() }

func (r *Router) cmd(change bool, argv ...string) []string {
	out := append([]string(nil), r.Prefix...)
	if change && r.Sudo {
		out = append(out, "sudo")
	}
	return append(out, argv...)
}

// GetCommand is the read-only query for cidr.
func (r *Router) GetCommand(cidr netip.Prefix) []string {
	if r.Style == BSD {
		return r.cmd(false, "route", "-n", "get", "-net", cidr.String())
	}
	return r.cmd(false, "ip", "-j", "-4", "route", "show", "exact", cidr.String())
}

// AddCommand adds (or, with change, replaces) the route cidr via gw.
func (r *Router) AddCommand(cidr netip.Prefix, gw netip.Addr, change bool) []string {
	if r.Style == BSD {
		verb := "add"
		if change {
			verb = "change"
		}
		return r.cmd(true, "route", "-n", verb, "-net", cidr.String(), gw.String())
	}
	return r.cmd(true, "ip", "route", "replace", cidr.String(), "via", gw.String())
}

// DeleteCommand removes the route for cidr.
func (r *Router) DeleteCommand(cidr netip.Prefix) []string {
	if r.Style == BSD {
		return r.cmd(true, "route", "-n", "delete", "-net", cidr.String())
	}
	return r.cmd(true, "ip", "route", "del", cidr.String())
}

// Check reads the route for cidr and compares its gateway with gw.
func (r *Router) Check(ctx context.Context, cidr netip.Prefix, gw netip.Addr) (RouteStatus, error) {
	out, err := r.Exec(ctx, r.GetCommand(cidr))
	var st RouteStatus
	if err != nil {
		// BSD route exits non-zero with "not in table" when nothing matches.
		var ee *vm.ExitError
		if r.Style == BSD && errors.As(err, &ee) && strings.Contains(ee.Stderr, "not in table") {
			return RouteStatus{CIDR: cidr}, nil
		}
		return RouteStatus{CIDR: cidr}, fmt.Errorf("read route for %s: %w", cidr, err)
	}
	if r.Style == BSD {
		st, err = ParseBSDRouteGet(out, cidr)
	} else {
		st, err = ParseIPRouteJSON(out, cidr)
	}
	if err != nil {
		return st, err
	}
	st.Correct = st.Present && st.Gateway == gw
	return st, nil
}

// Ensure makes the route cidr -> gw exist, doing nothing when it is exactly
// right and replacing a route with another gateway. Reports whether it
// changed anything.
func (r *Router) Ensure(ctx context.Context, cidr netip.Prefix, gw netip.Addr) (bool, error) {
	if !cidr.IsValid() || !gw.IsValid() || !gw.Is4() {
		return false, fmt.Errorf("route %v via %v: invalid address", cidr, gw)
	}
	st, err := r.Check(ctx, cidr, gw)
	if err != nil {
		return false, err
	}
	if st.Correct {
		return false, nil
	}
	if _, err := r.Exec(ctx, r.AddCommand(cidr, gw, st.Present)); err != nil {
		return false, fmt.Errorf("add route %s via %s (needs sudo): %w", cidr, gw, err)
	}
	return true, nil
}

// Remove deletes the route for cidr if present.
func (r *Router) Remove(ctx context.Context, cidr netip.Prefix) (bool, error) {
	st, err := r.Check(ctx, cidr, netip.Addr{})
	if err != nil || !st.Present {
		return false, err
	}
	if _, err := r.Exec(ctx, r.DeleteCommand(cidr)); err != nil {
		return false, fmt.Errorf("delete route %s (needs sudo): %w", cidr, err)
	}
	return true, nil
}

// ParseBSDRouteGet parses `route -n get -net <cidr>` output. macOS answers
// with the best matching route (often the default route), so the route is
// only Present when destination and mask equal cidr.
func ParseBSDRouteGet(out []byte, cidr netip.Prefix) (RouteStatus, error) {
	st := RouteStatus{CIDR: cidr}
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	dest, ok := fields["destination"]
	if !ok {
		return st, fmt.Errorf("unexpected route output (no destination): %q", strings.TrimSpace(string(out)))
	}
	if dest == "default" {
		return st, nil
	}
	da, err := netip.ParseAddr(dest)
	if err != nil {
		return st, nil // a host name or other non-matching entry
	}
	mask, err := netip.ParseAddr(fields["mask"])
	if err != nil || !mask.Is4() {
		return st, nil // host route
	}
	bits := maskBits(mask)
	if bits < 0 || netip.PrefixFrom(da, bits) != cidr {
		return st, nil
	}
	st.Present = true
	st.Interface = fields["interface"]
	if gw, err := netip.ParseAddr(fields["gateway"]); err == nil {
		st.Gateway = gw
	}
	return st, nil
}

func maskBits(mask netip.Addr) int {
	b := mask.As4()
	n := 0
	seenZero := false
	for _, x := range b {
		for i := 7; i >= 0; i-- {
			if x&(1<<i) != 0 {
				if seenZero {
					return -1
				}
				n++
			} else {
				seenZero = true
			}
		}
	}
	return n
}

// ParseIPRouteJSON parses `ip -j -4 route show exact <cidr>` output.
func ParseIPRouteJSON(out []byte, cidr netip.Prefix) (RouteStatus, error) {
	st := RouteStatus{CIDR: cidr}
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return st, nil
	}
	var routes []struct {
		Dst     string `json:"dst"`
		Gateway string `json:"gateway"`
		Dev     string `json:"dev"`
	}
	if err := json.Unmarshal(out, &routes); err != nil {
		return st, fmt.Errorf("parse ip route output: %w", err)
	}
	for _, rt := range routes {
		p, err := netip.ParsePrefix(rt.Dst)
		if err != nil || p != cidr {
			continue
		}
		st.Present = true
		st.Interface = rt.Dev
		if gw, err := netip.ParseAddr(rt.Gateway); err == nil {
			st.Gateway = gw
		}
		return st, nil
	}
	return st, nil
}

func notRoot() bool { return os.Geteuid() != 0 }

// RouteClash looks through `ip -j -4 route show` output for a route that
// overlaps cidr and does not belong to a Docker bridge (br-*, docker0);
// it returns that route ("" when none). The default route never clashes.
func RouteClash(out []byte, cidr netip.Prefix) (string, error) {
	var routes []struct {
		Dst string `json:"dst"`
		Dev string `json:"dev"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &routes); err != nil {
		return "", fmt.Errorf("parse ip route output: %w", err)
	}
	for _, rt := range routes {
		if rt.Dst == "default" || strings.HasPrefix(rt.Dev, "br-") || rt.Dev == "docker0" {
			continue
		}
		p, err := netip.ParsePrefix(rt.Dst)
		if err != nil {
			a, aerr := netip.ParseAddr(rt.Dst)
			if aerr != nil {
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Bits() > 0 && p.Overlaps(cidr) {
			return fmt.Sprintf("%s dev %s", rt.Dst, rt.Dev), nil
		}
	}
	return "", nil
}
