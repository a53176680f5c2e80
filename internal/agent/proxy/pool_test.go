package proxy

import (
	"net/netip"
	"testing"
	"time"
)

func TestPoolRoundRobinAndRetry(t *testing.T) {
	a, b, c := netip.MustParseAddrPort("100.64.0.1:80"), netip.MustParseAddrPort("100.64.0.2:80"), netip.MustParseAddrPort("100.64.0.3:80")
	p := newPool()
	p.set([]netip.AddrPort{a, b, c}, 0)
	client := netip.MustParseAddr("100.64.1.1")
	var got []netip.AddrPort
	for range 4 {
		ep, _ := p.pick(client, nil)
		got = append(got, ep)
	}
	if got[0] != a || got[1] != b || got[2] != c || got[3] != a {
		t.Errorf("round robin %v", got)
	}
	// Skipping those tried, each once.
	ep1, _ := p.pick(client, []netip.AddrPort{b})
	ep2, _ := p.pick(client, []netip.AddrPort{b, ep1})
	if _, ok := p.pick(client, []netip.AddrPort{a, b, c}); ok || ep1 == b || ep2 == b || ep1 == ep2 {
		t.Errorf("retries: %v %v", ep1, ep2)
	}
	p.set(nil, 0)
	if _, ok := p.pick(client, nil); ok {
		t.Error("picked from an empty pool")
	}
}

func TestPoolAffinity(t *testing.T) {
	a, b := netip.MustParseAddrPort("100.64.0.1:80"), netip.MustParseAddrPort("100.64.0.2:80")
	now := time.Unix(1000, 0)
	p := newPool()
	p.now = func() time.Time { return now }
	p.set([]netip.AddrPort{a, b}, 10*time.Second)
	c1, c2 := netip.MustParseAddr("100.64.1.1"), netip.MustParseAddr("100.64.1.2")
	first, _ := p.pick(c1, nil)
	p.settle(c1, first)
	for range 5 {
		now = now.Add(9 * time.Second) // each connection extends it
		if ep, _ := p.pick(c1, nil); ep != first {
			t.Fatalf("affinity lost: %v", ep)
		}
		p.settle(c1, first)
	}
	// Another client is balanced independently.
	other, _ := p.pick(c2, nil)
	if other == first {
		t.Errorf("second client got %v too", other)
	}
	// The sticky endpoint failing moves the client.
	if ep, _ := p.pick(c1, []netip.AddrPort{first}); ep == first {
		t.Error("tried endpoint picked again")
	}
	// Expiry: after the timeout the client is balanced afresh.
	now = now.Add(11 * time.Second)
	seen := map[netip.AddrPort]bool{}
	for range 2 {
		ep, _ := p.pick(c1, nil)
		seen[ep] = true
	}
	if len(seen) != 2 {
		t.Errorf("still sticky after the timeout: %v", seen)
	}
	// The sticky endpoint going away drops the entry.
	p.settle(c1, a)
	p.set([]netip.AddrPort{b}, 10*time.Second)
	if ep, _ := p.pick(c1, nil); ep != b {
		t.Errorf("picked %v", ep)
	}
	if len(p.sticky) != 0 {
		t.Errorf("sticky entries left: %v", p.sticky)
	}
}
