package dataplane

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The darwin pod network, rendered here without a build tag so the Linux
// tests cover it.
//
// darwin has no network namespaces. Each pod gets a /32 alias on lo0 from
// the node's range and its processes bind to it; the gateway is an alias
// too. Pod-to-pod and host-to-pod traffic is loopback traffic, and XNU
// keeps the address a socket is bound to as the source, so pods see each
// other's own addresses with no NAT and no forwarding. Only traffic
// leaving the machine needs translation: a pf nat rule in our anchor
// rewrites the pod source to the egress interface's address.
//
// Commands are argv slices with absolute paths (netd runs as root and
// must not depend on PATH), run without a shell.

// PFAnchor is the pf anchor holding the pods' nat rule. It sits under
// com.apple because macOS's stock /etc/pf.conf evaluates
// `nat-anchor "com.apple/*"`: a top-level anchor (com.k3sm) would load but
// never be consulted unless netd rewrote the main ruleset, which is the
// user's.
const PFAnchor = "com.apple/k3sm"

// PFAnchorFile is the name of the rules file under Options.PFDir.
const PFAnchorFile = "k3sm.pf.conf"

const (
	ifconfigPath = "/sbin/ifconfig"
	pfctlPath    = "/sbin/pfctl"
	routePath    = "/sbin/route"
	// A /32 alias: the node's /24 is not a subnet on lo0, only a set of
	// local addresses, so no route for the range shadows anything else.
	hostMask = "255.255.255.255"
)

func argvAlias(ip netip.Addr) []string {
	return []string{ifconfigPath, "lo0", "alias", ip.String(), "netmask", hostMask}
}

func argvUnalias(ip netip.Addr) []string {
	return []string{ifconfigPath, "lo0", "-alias", ip.String()}
}

func argvShowLo0() []string { return []string{ifconfigPath, "lo0"} }

func argvDefaultRoute() []string { return []string{routePath, "-n", "get", "default"} }

func argvPFLoad(file string) []string { return []string{pfctlPath, "-a", PFAnchor, "-f", file} }

func argvPFShowNAT() []string { return []string{pfctlPath, "-a", PFAnchor, "-s", "nat"} }

func argvPFFlush() []string { return []string{pfctlPath, "-a", PFAnchor, "-F", "all"} }

// argvPFEnable takes a reference on pf being enabled (-E, not -e): pf
// stays on while anyone holds one, so netd neither fails when the user
// already enabled it nor turns it off under them.
func argvPFEnable() []string { return []string{pfctlPath, "-E"} }

func argvPFRelease(token string) []string { return []string{pfctlPath, "-X", token} }

// argvMeshUp addresses the mesh's utun with the gateway at both ends (a
// point-to-point link needs a destination; the routes, not it, lead into
// the tunnel), sets its MTU and brings it up.
func argvMeshUp(dev string, gw netip.Addr, mtu int) []string {
	return []string{ifconfigPath, dev, "inet", gw.String(), gw.String(), "mtu", strconv.Itoa(mtu), "up"}
}

// argvMeshRoute adds (or deletes) a peer's pod range into the utun: the
// node's own traffic to it leaves from the utun's address, the gateway.
func argvMeshRoute(verb string, cidr netip.Prefix, dev string) []string {
	return []string{routePath, "-q", "-n", verb, "-inet", cidr.String(), "-interface", dev}
}

// renderAnchor is the anchor's rule set. The rule names the egress
// interface rather than `on ! lo0`: the translation address is that
// interface's, and translating traffic leaving by another one (a VPN
// tunnel) to it would be wrong. `(egress)` follows the interface's address
// as DHCP changes it without reloading the rules.
func renderAnchor(n Node, egress string) (string, error) {
	if err := checkNode(n); err != nil {
		return "", err
	}
	if egress == "" || len(egress) > ifNameMax || !isIfName(egress) {
		return "", fmt.Errorf("dataplane: egress interface %q is not a valid interface name", egress)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# k3sm pod network %s (anchor %s, written by k3sm-netd).\n", n.CIDR, PFAnchor)
	fmt.Fprintf(&b, "# Pods use lo0 aliases; only traffic leaving by %s is translated.\n", egress)
	fmt.Fprintf(&b, "nat on %s inet from %s to ! %s -> (%s)\n", egress, n.CIDR, n.CIDR, egress)
	return b.String(), nil
}

// parseLo0 returns the IPv4 addresses of `ifconfig lo0` output that fall
// in cidr.
func parseLo0(out []byte, cidr netip.Prefix) []netip.Addr {
	var addrs []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "inet" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err == nil && cidr.Contains(a) {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// parseRouteInterface returns the interface of `route -n get default`.
func parseRouteInterface(out []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "interface" {
			name := strings.TrimSpace(v)
			if name == "" || len(name) > ifNameMax || !isIfName(name) {
				return "", fmt.Errorf("dataplane: default route interface %q", name)
			}
			return name, nil
		}
	}
	return "", fmt.Errorf("dataplane: no default route (set the egress interface)")
}

// parsePFToken returns the reference token `pfctl -E` prints.
func parsePFToken(out []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "Token" {
			tok := strings.TrimSpace(v)
			for _, c := range tok {
				if c < '0' || c > '9' {
					return "", fmt.Errorf("dataplane: pf token %q is not a number", tok)
				}
			}
			if tok != "" {
				return tok, nil
			}
		}
	}
	return "", fmt.Errorf("dataplane: pfctl -E printed no token")
}

// parsePFNAT reports whether `pfctl -a <anchor> -s nat` lists a nat rule.
func parsePFNAT(out []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if strings.HasPrefix(strings.TrimSpace(sc.Text()), "nat on ") {
			return true
		}
	}
	return false
}
