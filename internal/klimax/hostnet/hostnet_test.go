package hostnet

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	goldenfile "github.com/k3sm-dev/k3sm/internal/golden"

	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenfile.Check(t, name, got)
}

var spec = RuleSpec{BridgeCIDR: netip.MustParsePrefix("172.30.0.0/16"), VMIface: "lima0"}

func TestRulesGolden(t *testing.T) {
	script, err := RenderRulesScript(spec)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "klimax-nosnat.sh", script)
	unit, dropIn, err := RenderUnits(spec)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "klimax-nosnat.service", unit)
	golden(t, "docker-dropin.conf", dropIn)
	inst, err := RenderInstaller(spec)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "install.sh", inst)

	var lines []string
	for _, r := range Rules(spec, netip.MustParsePrefix("192.168.105.7/24")) {
		lines = append(lines, r.Table+": "+r.String())
	}
	golden(t, "rules.txt", []byte(strings.Join(lines, "\n")+"\n"))
}

func TestRuleSpecValidation(t *testing.T) {
	bad := []RuleSpec{
		{BridgeCIDR: netip.MustParsePrefix("172.30.0.1/16"), VMIface: "lima0"}, // host bits
		{BridgeCIDR: netip.MustParsePrefix("fd00::/64"), VMIface: "lima0"},
		{VMIface: "lima0"},
		{BridgeCIDR: spec.BridgeCIDR, VMIface: "lima0; rm -rf /"},
		{BridgeCIDR: spec.BridgeCIDR, VMIface: ""},
	}
	for _, s := range bad {
		if _, err := RenderInstaller(s); err == nil {
			t.Errorf("spec %+v accepted", s)
		}
	}
}

func TestCheckChain(t *testing.T) {
	rule := Rules(spec, netip.MustParsePrefix("192.168.105.0/24"))[0]
	masq := "-A POSTROUTING -s 172.30.0.0/16 ! -o br-0123456789ab -j MASQUERADE"
	head := "-P POSTROUTING ACCEPT\n"
	cases := map[string]string{
		head + rule.String() + "\n" + masq + "\n":          "",
		head + masq + "\n" + rule.String() + "\n":          "not first",
		head + masq + "\n":                                 "lacks rule",
		head + rule.String() + "\n" + rule.String() + "\n": "2 times",
		head + rule.String() + "\n" + strings.Replace(rule.String(), "192.168.105.0/24", "192.168.64.0/24", 1): "stale",
	}
	for out, want := range cases {
		got := checkChain(out, rule)
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("checkChain(%q) = %q; want containing %q", out, got, want)
		}
	}
}

func TestRouteCommandsGolden(t *testing.T) {
	cidr := netip.MustParsePrefix("172.30.0.0/16")
	gw := netip.MustParseAddr("192.168.105.7")
	var b strings.Builder
	for _, r := range []*Router{{Style: BSD, Sudo: true}, {Style: IPRoute2, Sudo: false}} {
		for _, argv := range [][]string{r.GetCommand(cidr), r.AddCommand(cidr, gw, false), r.AddCommand(cidr, gw, true), r.DeleteCommand(cidr)} {
			b.WriteString(strings.Join(argv, " ") + "\n")
		}
	}
	golden(t, "route-commands.txt", []byte(b.String()))
}

const bsdRouteOK = `   route to: 172.30.0.0
destination: 172.30.0.0
       mask: 255.255.0.0
    gateway: 192.168.105.7
  interface: bridge100
      flags: <UP,GATEWAY,DONE,STATIC,PRCLONING>
 recvpipe  sendpipe  ssthresh  rtt,msec    rttvar  hopcount      mtu     expire
       0         0         0         0         0         0      1500         0
`

const bsdRouteDefault = `   route to: 172.30.0.0
destination: default
       mask: default
    gateway: 192.168.1.1
  interface: en0
      flags: <UP,GATEWAY,DONE,STATIC,PRCLONING,GLOBAL>
`

const bsdRouteWiderNet = `   route to: 172.30.0.0
destination: 172.16.0.0
       mask: 255.240.0.0
    gateway: 10.8.0.1
  interface: utun4
      flags: <UP,GATEWAY,DONE,STATIC,PRCLONING>
`

func TestParseBSDRouteGet(t *testing.T) {
	cidr := netip.MustParsePrefix("172.30.0.0/16")
	st, err := ParseBSDRouteGet([]byte(bsdRouteOK), cidr)
	if err != nil || !st.Present || st.Gateway.String() != "192.168.105.7" || st.Interface != "bridge100" {
		t.Fatalf("ok route: %+v, %v", st, err)
	}
	for name, out := range map[string]string{"default": bsdRouteDefault, "wider": bsdRouteWiderNet} {
		st, err := ParseBSDRouteGet([]byte(out), cidr)
		if err != nil || st.Present {
			t.Errorf("%s route taken as ours: %+v, %v", name, st, err)
		}
	}
	if _, err := ParseBSDRouteGet([]byte("garbage"), cidr); err == nil {
		t.Error("garbage accepted")
	}
}

// recorder is a fake host Exec: it answers `route get` from a table and
// records every command.
type recorder struct {
	get   string // output of the get command ("" -> "not in table" error)
	calls []string
}

func (r *recorder) exec(_ context.Context, argv []string) ([]byte, error) {
	r.calls = append(r.calls, strings.Join(argv, " "))
	if argv[0] == "route" && argv[2] == "get" {
		if r.get == "" {
			return nil, &vm.ExitError{Argv: argv, ExitCode: 1, Stderr: "route: writing to routing socket: not in table"}
		}
		return []byte(r.get), nil
	}
	return nil, nil
}

func TestBSDRouterEnsureSequence(t *testing.T) {
	ctx := context.Background()
	cidr := netip.MustParsePrefix("172.30.0.0/16")
	gw := netip.MustParseAddr("192.168.105.7")
	cases := []struct {
		name, get string
		want      []string
		changed   bool
	}{
		{"absent", "", []string{"route -n get -net 172.30.0.0/16", "sudo route -n add -net 172.30.0.0/16 192.168.105.7"}, true},
		{"default only", bsdRouteDefault, []string{"route -n get -net 172.30.0.0/16", "sudo route -n add -net 172.30.0.0/16 192.168.105.7"}, true},
		{"wrong gateway", strings.Replace(bsdRouteOK, "192.168.105.7", "192.168.64.2", 1), []string{"route -n get -net 172.30.0.0/16", "sudo route -n change -net 172.30.0.0/16 192.168.105.7"}, true},
		{"exactly right", bsdRouteOK, []string{"route -n get -net 172.30.0.0/16"}, false},
	}
	for _, c := range cases {
		rec := &recorder{get: c.get}
		r := &Router{Style: BSD, Exec: rec.exec, Sudo: true}
		changed, err := r.Ensure(ctx, cidr, gw)
		if err != nil || changed != c.changed || !reflect.DeepEqual(rec.calls, c.want) {
			t.Errorf("%s: changed=%v err=%v calls=%q; want %v %q", c.name, changed, err, rec.calls, c.changed, c.want)
		}
	}
	rec := &recorder{get: bsdRouteOK}
	r := &Router{Style: BSD, Exec: rec.exec, Sudo: true}
	if removed, err := r.Remove(ctx, cidr); err != nil || !removed || rec.calls[1] != "sudo route -n delete -net 172.30.0.0/16" {
		t.Errorf("remove: %v %v %q", removed, err, rec.calls)
	}
	rec = &recorder{}
	r.Exec = rec.exec
	if removed, err := r.Remove(ctx, cidr); err != nil || removed || len(rec.calls) != 1 {
		t.Errorf("remove absent: %v %v %q", removed, err, rec.calls)
	}
}

func TestParseIPRouteJSONAndClash(t *testing.T) {
	cidr := netip.MustParsePrefix("172.30.0.0/16")
	st, err := ParseIPRouteJSON([]byte(`[{"dst":"172.30.0.0/16","gateway":"192.168.105.7","dev":"eth1","flags":[]}]`), cidr)
	if err != nil || !st.Present || st.Gateway.String() != "192.168.105.7" {
		t.Fatalf("%+v %v", st, err)
	}
	st, err = ParseIPRouteJSON([]byte(`[]`), cidr)
	if err != nil || st.Present {
		t.Fatalf("empty: %+v %v", st, err)
	}
	table := []byte(`[{"dst":"default","gateway":"10.0.0.1","dev":"eth0"},
{"dst":"172.17.0.0/16","dev":"docker0"},{"dst":"172.30.0.0/16","dev":"br-0123456789ab"},
{"dst":"172.16.0.0/12","gateway":"10.8.0.1","dev":"tun0"}]`)
	clash, err := RouteClash(table, cidr)
	if err != nil || clash != "172.16.0.0/12 dev tun0" {
		t.Fatalf("clash = %q, %v", clash, err)
	}
	clash, err = RouteClash([]byte(`[{"dst":"default","dev":"eth0"},{"dst":"172.30.0.0/16","dev":"br-0123456789ab"}]`), cidr)
	if err != nil || clash != "" {
		t.Fatalf("no clash expected: %q, %v", clash, err)
	}
}

func TestIntegrationLinuxRouterInNetns(t *testing.T) {
	ns := testNetns(t)
	ctx := context.Background()
	fakeLima0(t, ns)
	r := &Router{Style: IPRoute2, Exec: LocalExec, Prefix: []string{"ip", "netns", "exec", ns}}
	cidr := netip.MustParsePrefix("172.30.0.0/16")
	gw := netip.MustParseAddr("192.0.2.1")
	if changed, err := r.Ensure(ctx, cidr, gw); err != nil || !changed {
		t.Fatalf("Ensure = %v, %v", changed, err)
	}
	if changed, err := r.Ensure(ctx, cidr, gw); err != nil || changed {
		t.Fatalf("second Ensure = %v, %v; want no change", changed, err)
	}
	st, err := r.Check(ctx, cidr, gw)
	if err != nil || !st.Correct || st.Interface != "lima0" {
		t.Fatalf("Check = %+v, %v", st, err)
	}
	if removed, err := r.Remove(ctx, cidr); err != nil || !removed {
		t.Fatalf("Remove = %v, %v", removed, err)
	}
	if st, _ := r.Check(ctx, cidr, gw); st.Present {
		t.Fatal("route still present")
	}
}

// nsRunner runs guest commands inside a test network namespace.
type nsRunner struct{ ns string }

func (n nsRunner) Run(ctx context.Context, argv []string, opts vm.RunOptions) (vm.Result, error) {
	opts.Root = false // tests run as root
	return vm.NewHost().Run(ctx, append([]string{"ip", "netns", "exec", n.ns}, argv...), opts)
}

// TestIntegrationRulesScriptInNetns runs the rendered rules script with the
// real iptables inside a namespace the test creates (a dummy lima0, a
// Docker-like MASQUERADE rule and DOCKER-USER chain) and checks the result
// with CheckRules: applied first in chain, re-ordered after "Docker"
// re-inserts its rule, stale rules for an old VM network removed.
func TestIntegrationRulesScriptInNetns(t *testing.T) {
	ns := testNetns(t)
	ctx := context.Background()
	fakeLima0(t, ns)
	masq := []string{"iptables", "-w", "5", "-t", "nat", "-I", "POSTROUTING", "1", "-s", "172.30.0.0/16", "!", "-o", "br-0123456789ab", "-j", "MASQUERADE"}
	run(t, ns, masq...)
	run(t, ns, "iptables", "-w", "5", "-N", "DOCKER-USER")
	run(t, ns, "iptables", "-w", "5", "-A", "DOCKER-USER", "-j", "RETURN")

	r := nsRunner{ns}
	script, err := RenderRulesScript(spec)
	if err != nil {
		t.Fatal(err)
	}
	apply := func() {
		t.Helper()
		if _, err := r.Run(ctx, []string{"sh", "-s"}, vm.RunOptions{Stdin: strings.NewReader(string(script))}); err != nil {
			t.Fatal(err)
		}
	}
	active := func() RulesStatus {
		t.Helper()
		st, err := CheckRules(ctx, r, spec)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := active(); st.Active {
		t.Fatal("rules reported active before the script ran")
	}
	apply()
	st := active()
	if !st.Active || st.VMNet.String() != "192.0.2.0/24" {
		t.Fatalf("after script: %+v", st)
	}
	if st.Installed {
		t.Fatal("files reported installed although only the script ran")
	}
	// Docker restarts and inserts its MASQUERADE on top again.
	run(t, ns, masq...)
	if st := active(); st.Active {
		t.Fatal("rule below MASQUERADE reported active")
	}
	apply()
	apply() // twice: still exactly one copy
	if st := active(); !st.Active {
		t.Fatalf("after re-apply: %v", st.Problems)
	}
	// The VM network changes (new vzNAT lease): the old rules go.
	run(t, ns, "ip", "addr", "flush", "dev", "lima0")
	run(t, ns, "ip", "addr", "add", "198.51.100.20/24", "dev", "lima0")
	if st := active(); st.Active {
		t.Fatal("rules for the old network reported active")
	}
	apply()
	if st := active(); !st.Active || st.VMNet.String() != "198.51.100.0/24" {
		t.Fatalf("after network change: %+v", st)
	}
}

func testNetns(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("netns test skipped under -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	ns := "klimaxtest" + strings.ReplaceAll(filepath.Base(t.TempDir()), "0", "")
	if len(ns) > 30 {
		ns = ns[:30]
	}
	if _, err := LocalExec(context.Background(), []string{"ip", "netns", "add", ns}); err != nil {
		t.Skipf("cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() { LocalExec(context.Background(), []string{"ip", "netns", "del", ns}) })
	return ns
}

func run(t *testing.T, ns string, argv ...string) {
	t.Helper()
	if _, err := LocalExec(context.Background(), append([]string{"ip", "netns", "exec", ns}, argv...)); err != nil {
		var ee *vm.ExitError
		if errors.As(err, &ee) && strings.Contains(ee.Stderr, "iptables") && strings.Contains(ee.Stderr, "not supported") {
			t.Skipf("iptables unusable here: %v", err)
		}
		t.Fatal(err)
	}
}

// fakeLima0 gives the namespace a lima0 (one end of a veth pair, both ends
// inside the namespace) with an address from TEST-NET-1.
func fakeLima0(t *testing.T, ns string) {
	t.Helper()
	run(t, ns, "ip", "link", "add", "lima0", "type", "veth", "peer", "name", "peer0")
	run(t, ns, "ip", "addr", "add", "192.0.2.10/24", "dev", "lima0")
	run(t, ns, "ip", "link", "set", "lima0", "up")
	run(t, ns, "ip", "link", "set", "peer0", "up")
}
