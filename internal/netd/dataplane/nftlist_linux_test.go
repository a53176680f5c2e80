package dataplane

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// nftListing runs the system nft with args in the fixture's host
// namespace. nft aborting (an assertion on an expression it cannot parse
// back) or exiting non-zero fails the test: a user could not
// read the rules with the distribution's own tool.
func (f *fixture) nftListing(args ...string) string {
	f.t.Helper()
	nft, err := exec.LookPath("nft")
	if err != nil {
		if os.Getenv("CI") != "" {
			f.t.Fatal("nft is not installed, and CI must run this test (.ci/run installs nftables)")
		}
		f.t.Skip("nft is not installed (apt-get install nftables): cannot check that it lists k3sm's tables")
	}
	var stderr strings.Builder
	cmd := exec.Command("nsenter", "--net="+f.hostNS, nft)
	cmd.Args = append(cmd.Args, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		f.t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	// nft warns that iptables-nft owns table ip filter (Docker's FORWARD
	// chain, which holds our accepts); anything else it says is a problem.
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if l != "" && !strings.HasPrefix(l, "# Warning: table ip filter is managed by iptables-nft") {
			f.t.Errorf("nft %s says: %s", strings.Join(args, " "), l)
		}
	}
	return string(out)
}

// TestNFTListsRules: the system's nft (Debian 12's is 1.0.6) lists every
// table netd writes, in text and JSON, holding a representative set:
// ClusterIPs with endpoints on this node and another, UDP, no endpoints,
// externalIPs, nodePorts and a load-balancer port with Cluster and Local,
// a Service of more endpoints than one message holds, NetworkPolicy with
// peers, exceptions and port ranges, and the accepts in iptables-nft's
// FORWARD chain.
func TestNFTListsRules(t *testing.T) {
	f := newFixture(t)
	f.dockerChain() // before the node, whose accepts go into its FORWARD chain
	n := f.upServices()
	node := netip.MustParseAddr("192.0.2.1")
	ext := netip.MustParseAddr("203.0.113.10")
	elsewhere := netip.AddrPortFrom(netip.MustParseAddr("100.64.8.5"), 8080) // another node's pod
	big := tcpSvc(netip.MustParseAddr("10.96.0.20"))
	for i := range elementsPerMessage + 2 {
		big.Endpoints = append(big.Endpoints, netip.AddrPortFrom(f.a.IP, uint16(20000+i)))
	}
	f.setServices(n,
		tcpSvc(vip, at(f.a.IP), at(f.b.IP)),
		tcpSvc(vipA, at(f.a.IP), elsewhere),
		tcpSvc(vipEmpty),
		Service{Protocol: UDP, IP: vip, Port: 53, Endpoints: []netip.AddrPort{netip.AddrPortFrom(f.b.IP, 5353)}},
		big,
		Service{Protocol: TCP, IP: ext, Port: 80, External: true, Endpoints: []netip.AddrPort{elsewhere}},
		Service{Protocol: TCP, IP: ext, Port: 443, External: true, Local: true, Endpoints: []netip.AddrPort{at(f.b.IP)}},
		Service{Protocol: UDP, IP: ext, Port: 53, External: true},
		Service{Protocol: TCP, IP: node, Port: 30080, OnNode: true, Local: true, Endpoints: []netip.AddrPort{at(f.a.IP)}},
		Service{Protocol: TCP, IP: node, Port: 30081, OnNode: true, Endpoints: []netip.AddrPort{at(f.a.IP), elsewhere}},
		Service{Protocol: TCP, IP: node, Port: 30082, OnNode: true, Local: true},
		Service{Protocol: TCP, IP: node, Port: 80, OnNode: true, Endpoints: []netip.AddrPort{at(f.b.IP)}}, // load-balancer ingress
	)
	f.setPolicy(f.a, Policy{
		Ingress: Direction{Isolated: true, Rules: []Rule{{
			Peers: []Peer{peer(f.b.IP), {CIDR: pfx("10.0.0.0/8"), Except: []netip.Prefix{pfx("10.1.0.0/16")}}},
			Ports: []Port{{Protocol: TCP, Port: 8080}, {Protocol: UDP, Port: 5000, EndPort: 5010}, {Protocol: SCTP}},
		}}},
		Egress: Direction{Isolated: true, Rules: []Rule{{Ports: []Port{{Protocol: UDP, Port: 53}}}, {Peers: []Peer{peer(f.b.IP)}}}},
	})
	f.setPolicy(f.b, Policy{Ingress: Direction{Isolated: true}})

	text := f.nftListing("list", "ruleset")
	for _, want := range []string{
		"table ip k3sm {",
		`ip saddr 100.64.7.0/24 ip daddr != 100.64.7.0/24 oifname != "k3sm0" oifname != "k3sm-wg" counter`,
		`oifname "k3sm0" ct state related,established counter`,
		"table ip k3sm-services {",
		"ip daddr . meta l4proto . th dport vmap @services",
		"fib daddr type local ip daddr . meta l4proto . th dport vmap @node-ports",
		"192.0.2.1 . tcp . 30082 : goto reject",
		"ip saddr . ip daddr @hairpin counter",
		fmt.Sprintf("ct mark & 0x%08x == 0x%08x counter", localMark, localMark),
		fmt.Sprintf("ct mark set ct mark | 0x%08x\n", localMark),
		`ct status dnat oifname "k3sm0" ip saddr != 100.64.7.0/24 counter`,
		// The endpoints' indexes, as numgen counts them.
		"numgen random mod 2 vmap { 0 : goto ep-10.96.0.10-80-tcp-100.64.7.2-8080, 1 : goto ep-10.96.0.10-80-tcp-100.64.7.3-8080 }",
		"numgen random mod 130 vmap @eps-10.96.0.20-80-tcp",
		"129 : goto ep-10.96.0.20-80-tcp-100.64.7.2-20129 }",
		"dnat to 100.64.8.5:8080",
		"table ip k3sm-policy {",
		"ip saddr vmap @egress",
		"udp dport { 5000-5010 } counter",
		"table bridge k3sm-guard {",
		"iifname vmap @guard",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("nft list ruleset lacks %q", want)
		}
	}
	// The guard map's keys, the pods' interface names (the policy maps'
	// comments name them too, before a jump to <name>-in).
	for _, p := range []Pod{f.a, f.b} {
		if !regexp.MustCompile(fmt.Sprintf(`"%s" : jump %s[,\s]`, p.HostIf, p.HostIf)).MatchString(text) {
			t.Errorf("nft list ruleset lacks the guard map's element for %s", p.HostIf)
		}
	}
	if t.Failed() {
		t.Logf("nft list ruleset:\n%s", text)
	}

	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(f.nftListing("-j", "list", "ruleset")), &doc); err != nil {
		t.Fatalf("nft -j list ruleset: %v", err)
	}
	tables := map[string]bool{}
	for _, o := range doc.Nftables {
		var tb struct{ Family, Name string }
		if raw, ok := o["table"]; ok && json.Unmarshal(raw, &tb) == nil {
			tables[tb.Family+" "+tb.Name] = true
		}
	}
	for _, want := range []string{"ip k3sm", "ip filter", "ip k3sm-services", "ip k3sm-policy", "bridge k3sm-guard"} {
		if !tables[want] {
			t.Errorf("nft -j list ruleset has no table %s (has %v)", want, tables)
		}
	}
}
