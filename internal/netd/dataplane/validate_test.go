package dataplane

import (
	"net/netip"
	"slices"
	"testing"
)

func TestCheckNode(t *testing.T) {
	good := Node{CIDR: netip.MustParsePrefix("100.64.7.0/24"), Gateway: netip.MustParseAddr("100.64.7.1"), Bridge: "k3sm0"}
	if err := checkNode(good); err != nil {
		t.Fatalf("%+v refused: %v", good, err)
	}
	bad := map[string]func(*Node){
		"IPv6 CIDR":       func(n *Node) { n.CIDR = netip.MustParsePrefix("fd00::/64") },
		"host bits":       func(n *Node) { n.CIDR = netip.MustParsePrefix("100.64.7.5/24") },
		"/32":             func(n *Node) { n.CIDR = netip.MustParsePrefix("100.64.7.0/32") },
		"gateway outside": func(n *Node) { n.Gateway = netip.MustParseAddr("100.64.8.1") },
		"gateway network": func(n *Node) { n.Gateway = netip.MustParseAddr("100.64.7.0") },
		"no bridge":       func(n *Node) { n.Bridge = "" },
		"long bridge":     func(n *Node) { n.Bridge = "k3sm0123456789ab" },
		"slash in bridge": func(n *Node) { n.Bridge = "k3/sm" },
	}
	for name, mutate := range bad {
		n := good
		mutate(&n)
		if err := checkNode(n); err == nil {
			t.Errorf("%s: %+v accepted", name, n)
		}
	}
	for ip, ok := range map[string]bool{
		"100.64.7.2": true, "100.64.7.254": true,
		"100.64.7.0": false, "100.64.7.1": false, "100.64.7.255": false, "100.64.8.2": false, "::1": false,
	} {
		if err := checkPodIP(good, netip.MustParseAddr(ip)); (err == nil) != ok {
			t.Errorf("checkPodIP(%s) = %v, want ok=%v", ip, err, ok)
		}
	}
}

func TestBroadcast(t *testing.T) {
	for p, want := range map[string]string{"10.42.0.0/16": "10.42.255.255", "100.64.7.0/24": "100.64.7.255", "10.0.0.5/30": "10.0.0.7"} {
		if b := Broadcast(netip.MustParsePrefix(p)); b.String() != want {
			t.Errorf("Broadcast(%s) = %s, want %s", p, b, want)
		}
	}
}

func TestPeerRanges(t *testing.T) {
	r := func(lo, hi string) addrRange {
		return addrRange{addrNum(netip.MustParseAddr(lo)), addrNum(netip.MustParseAddr(hi))}
	}
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		peers []Peer
		want  []addrRange
	}{
		{[]Peer{{CIDR: p("10.0.0.0/24"), Except: []netip.Prefix{p("10.0.0.128/25"), p("10.0.0.0/32")}}}, []addrRange{r("10.0.0.1", "10.0.0.127")}},
		{[]Peer{{CIDR: p("10.0.0.1/32")}, {CIDR: p("10.0.0.2/32")}, {CIDR: p("10.0.0.0/30")}, {CIDR: p("10.0.0.8/32")}}, []addrRange{r("10.0.0.0", "10.0.0.3"), r("10.0.0.8", "10.0.0.8")}},
		{[]Peer{{CIDR: p("0.0.0.0/0"), Except: []netip.Prefix{p("10.0.0.0/8")}}}, []addrRange{r("0.0.0.0", "9.255.255.255"), r("11.0.0.0", "255.255.255.255")}},
		{[]Peer{{CIDR: p("10.0.0.0/8"), Except: []netip.Prefix{p("10.0.0.0/8")}}}, nil},
	} {
		if got := peerRanges(tc.peers); !slices.Equal(got, tc.want) {
			t.Errorf("peerRanges(%v) = %v, want %v", tc.peers, got, tc.want)
		}
	}
}
