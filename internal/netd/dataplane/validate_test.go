package dataplane

import (
	"net/netip"
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
