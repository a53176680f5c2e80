package dataplane

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/golden"
)

var macNode = Node{
	CIDR:    netip.MustParsePrefix("100.64.7.0/24"),
	Gateway: netip.MustParseAddr("100.64.7.1"),
	Bridge:  "k3sm0",
}

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRenderCommands: every command darwin runs, as argv.
func TestRenderCommands(t *testing.T) {
	ip := netip.MustParseAddr("100.64.7.2")
	var b strings.Builder
	for _, c := range []struct {
		name string
		argv []string
	}{
		{"node gateway alias", argvAlias(macNode.Gateway)},
		{"pod alias", argvAlias(ip)},
		{"pod alias removal", argvUnalias(ip)},
		{"read lo0", argvShowLo0()},
		{"default route", argvDefaultRoute()},
		{"load anchor", argvPFLoad("/var/db/k3sm/netd/" + PFAnchorFile)},
		{"enable pf", argvPFEnable()},
		{"release pf", argvPFRelease("11259375482112376")},
		{"show anchor nat", argvPFShowNAT()},
		{"flush anchor", argvPFFlush()},
		{"mesh device up", argvMeshUp("utun7", macNode.Gateway, 1380)},
		{"mesh route", argvMeshRoute("add", netip.MustParsePrefix("100.64.8.0/24"), "utun7")},
		{"mesh route removal", argvMeshRoute("delete", netip.MustParsePrefix("100.64.8.0/24"), "utun7")},
	} {
		fmt.Fprintf(&b, "%s: %q\n", c.name, c.argv)
	}
	golden.Check(t, "darwin_commands.txt", []byte(b.String()))
}

// TestRenderAnchor: the pf rule set, and that names pf would misread are
// refused rather than written into it.
func TestRenderAnchor(t *testing.T) {
	rules, err := renderAnchor(macNode, "en0")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "darwin_anchor.pf.conf", []byte(rules))
	for _, bad := range []string{"", "en0 -> (lo0)", "en0\nnat", "en0123456789abcdef"} {
		if _, err := renderAnchor(macNode, bad); err == nil {
			t.Errorf("egress %q accepted", bad)
		}
	}
	n := macNode
	n.Gateway = netip.MustParseAddr("10.0.0.1")
	if _, err := renderAnchor(n, "en0"); err == nil {
		t.Error("invalid node accepted")
	}
}

// TestParse: the readers of ifconfig, route, and pfctl output, on text in
// the format macOS prints.
func TestParse(t *testing.T) {
	got := parseLo0(readTestdata(t, "ifconfig_lo0.txt"), macNode.CIDR)
	want := []netip.Addr{netip.MustParseAddr("100.64.7.1"), netip.MustParseAddr("100.64.7.2"), netip.MustParseAddr("100.64.7.3")}
	if !slices.Equal(got, want) {
		t.Errorf("parseLo0 = %v, want %v (127.0.0.1 and 100.64.8.9 are outside the range)", got, want)
	}
	if got := parseLo0(nil, macNode.CIDR); len(got) != 0 {
		t.Errorf("parseLo0(empty) = %v", got)
	}
	if ifc, err := parseRouteInterface(readTestdata(t, "route_get_default.txt")); err != nil || ifc != "en0" {
		t.Errorf("parseRouteInterface = %q, %v; want en0", ifc, err)
	}
	if _, err := parseRouteInterface([]byte("route: writing to routing socket: not in table\n")); err == nil {
		t.Error("parseRouteInterface without a default route succeeded")
	}
	if _, err := parseRouteInterface([]byte("  interface: en0;rm\n")); err == nil {
		t.Error("parseRouteInterface accepted a malformed name")
	}
	if tok, err := parsePFToken(readTestdata(t, "pfctl_E.txt")); err != nil || tok != "11259375482112376" {
		t.Errorf("parsePFToken = %q, %v", tok, err)
	}
	if _, err := parsePFToken([]byte("Token : 12x\n")); err == nil {
		t.Error("parsePFToken accepted a non-number")
	}
	if !parsePFNAT(readTestdata(t, "pfctl_s_nat.txt")) {
		t.Error("parsePFNAT missed the nat rule")
	}
	if parsePFNAT([]byte("No ALTQ support in kernel\nALTQ related functions disabled\n")) {
		t.Error("parsePFNAT found a rule in an empty anchor")
	}
}

// fakeMac plays lo0 and pf for loPlane and records every command.
type fakeMac struct {
	t      *testing.T
	pfDir  string
	log    strings.Builder
	lo0    []netip.Addr
	anchor string // rules loaded into PFAnchor
}

func newFakeMac(t *testing.T) (*fakeMac, *loPlane) {
	f := &fakeMac{t: t, pfDir: t.TempDir(), lo0: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}
	d, err := newLoPlane(Options{Runner: f.run, Output: f.output, PFDir: f.pfDir})
	if err != nil {
		t.Fatal(err)
	}
	return f, d
}

func (f *fakeMac) record(kind string, argv []string) {
	fmt.Fprintf(&f.log, "%s %s\n", kind, strings.ReplaceAll(strings.Join(argv, " "), f.pfDir, "<PFDir>"))
}

func (f *fakeMac) run(argv []string) error {
	f.record("run", argv)
	switch {
	case slices.Equal(argv[:3], []string{ifconfigPath, "lo0", "alias"}):
		f.lo0 = append(f.lo0, netip.MustParseAddr(argv[3]))
	case slices.Equal(argv[:3], []string{ifconfigPath, "lo0", "-alias"}):
		a := netip.MustParseAddr(argv[3])
		if !slices.Contains(f.lo0, a) {
			return fmt.Errorf("ifconfig: ioctl (SIOCDIFADDR): Can't assign requested address")
		}
		f.lo0 = slices.DeleteFunc(f.lo0, func(x netip.Addr) bool { return x == a })
	case argv[0] == pfctlPath && slices.Contains(argv, "-f"):
		b, err := os.ReadFile(argv[4])
		if err != nil {
			return err
		}
		f.anchor = string(b)
	case argv[0] == pfctlPath && slices.Contains(argv, "-F"):
		f.anchor = ""
	}
	return nil
}

func (f *fakeMac) output(argv []string) ([]byte, error) {
	f.record("read", argv)
	switch {
	case slices.Equal(argv, argvShowLo0()):
		var b strings.Builder
		b.WriteString("lo0: flags=8049<UP,LOOPBACK,RUNNING,MULTICAST> mtu 16384\n")
		for _, a := range f.lo0 {
			mask := "0xffffffff"
			if a.IsLoopback() {
				mask = "0xff000000"
			}
			fmt.Fprintf(&b, "\tinet %s netmask %s\n", a, mask)
		}
		return []byte(b.String()), nil
	case slices.Equal(argv, argvDefaultRoute()):
		return readTestdata(f.t, "route_get_default.txt"), nil
	case slices.Equal(argv, argvPFEnable()):
		return readTestdata(f.t, "pfctl_E.txt"), nil
	case slices.Equal(argv, argvPFShowNAT()):
		if f.anchor == "" {
			return []byte("No ALTQ support in kernel\n"), nil
		}
		return readTestdata(f.t, "pfctl_s_nat.txt"), nil
	}
	return nil, fmt.Errorf("unexpected command %q", argv)
}

func (f *fakeMac) step(name string) { fmt.Fprintf(&f.log, "# %s\n", name) }

// TestLoPlaneSequence: the commands of a node's whole life, including
// that repeats add nothing, removal of what is gone runs nothing, and an
// address outside the pod range is never removed from lo0.
func TestLoPlaneSequence(t *testing.T) {
	f, d := newFakeMac(t)
	a := Pod{UID: "a", IP: netip.MustParseAddr("100.64.7.2")}
	b := Pod{UID: "b", IP: netip.MustParseAddr("100.64.7.3")}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	inventory := func() Inventory {
		t.Helper()
		inv, err := d.Inventory(macNode)
		must(err)
		fmt.Fprintf(&f.log, "= %+v\n", inv)
		return inv
	}

	f.step("DelPod before the node is known: refused, nothing run")
	if err := d.DelPod(a); err == nil {
		t.Error("DelPod before any node succeeded")
	}
	f.step("Inventory of a fresh machine")
	if inv := inventory(); inv.NodeReady || len(inv.Addrs) != 0 {
		t.Errorf("fresh Inventory = %+v", inv)
	}
	f.step("EnsureNode")
	must(d.EnsureNode(macNode))
	f.step("EnsureNode again: reloads the anchor, keeps the alias and the pf reference")
	must(d.EnsureNode(macNode))
	f.step("AddPod a, b, a")
	must(d.AddPod(macNode, a))
	must(d.AddPod(macNode, b))
	must(d.AddPod(macNode, a))
	f.step("Inventory")
	if inv := inventory(); !inv.NodeReady || !slices.Equal(inv.Addrs, []netip.Addr{a.IP, b.IP}) {
		t.Errorf("Inventory = %+v", inv)
	}
	f.step("DelPod a twice")
	must(d.DelPod(a))
	must(d.DelPod(a))
	f.step("DelPod of addresses that are not pods': refused")
	for _, ip := range []string{"127.0.0.1", "100.64.7.1", "100.64.8.2"} {
		if err := d.DelPod(Pod{IP: netip.MustParseAddr(ip)}); err == nil {
			t.Errorf("DelPod %s accepted", ip)
		}
	}
	f.step("DelNode")
	must(d.DelNode(macNode))
	if _, err := os.Stat(filepath.Join(f.pfDir, PFAnchorFile)); !os.IsNotExist(err) {
		t.Errorf("anchor file left after DelNode: %v", err)
	}
	f.step("Inventory after DelNode: b's alias is still DelPod's to remove")
	if inv := inventory(); inv.NodeReady {
		t.Errorf("NodeReady after DelNode: %+v", inv)
	}
	golden.Check(t, "darwin_sequence.txt", []byte(f.log.String()))
	if !slices.Equal(f.lo0, []netip.Addr{netip.MustParseAddr("127.0.0.1"), b.IP}) {
		t.Errorf("lo0 at the end = %v", f.lo0)
	}
}

// TestLoPlaneAnchorFile: the file pfctl loads is the rendered rule set,
// private to netd.
func TestLoPlaneAnchorFile(t *testing.T) {
	f, d := newFakeMac(t)
	if err := d.EnsureNode(macNode); err != nil {
		t.Fatal(err)
	}
	want, _ := renderAnchor(macNode, "en0")
	if f.anchor != want {
		t.Errorf("loaded anchor = %q, want %q", f.anchor, want)
	}
	st, err := os.Stat(filepath.Join(f.pfDir, PFAnchorFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("anchor file mode %v, want 0600", st.Mode().Perm())
	}
}

func TestNewLoPlaneRefuses(t *testing.T) {
	run := func([]string) error { return nil }
	out := func([]string) ([]byte, error) { return nil, nil }
	for name, o := range map[string]Options{
		"no runner":       {Output: out, PFDir: "/x"},
		"no PFDir":        {Runner: run, Output: out},
		"relative PFDir":  {Runner: run, Output: out, PFDir: "x"},
		"egress with ';'": {Runner: run, Output: out, PFDir: "/x", Egress: "en0;"},
	} {
		if _, err := newLoPlane(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
