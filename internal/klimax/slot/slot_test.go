package slot

import (
	"fmt"
	"net/netip"
	"testing"
)

func TestReferenceValuesForOneToNine(t *testing.T) {
	for n := 1; n <= 9; n++ {
		s := Slot(n)
		if s.APIPort() != 7000+n {
			t.Errorf("slot %d port %d", n, s.APIPort())
		}
		if got, want := s.ServiceSubnet().String(), fmt.Sprintf("10.%d.0.0/16", n); got != want {
			t.Errorf("slot %d service %s want %s", n, got, want)
		}
		if got, want := s.PodSubnet().String(), fmt.Sprintf("10.1%d.0.0/16", n); got != want {
			t.Errorf("slot %d pod %s want %s", n, got, want)
		}
	}
	if r := Slot(2).MetalLBRanges("172.30"); r[0] != "172.30.2.1-172.30.2.7" || r[1] != "172.30.2.16-172.30.2.254" {
		t.Errorf("metallb %v", r)
	}
	if Slot(42).ServiceSubnet().String() != "10.52.0.0/16" || Slot(42).PodSubnet().String() != "10.142.0.0/16" || Slot(99).APIPort() != 7099 {
		t.Error("large-slot scheme changed; update docs/klimax.md")
	}
}

// TestNoOverlapAllSlots proves that among all 99 slots no two subnets
// (service or pod, of the same or different slots) overlap, that API ports and
// MetalLB pools are unique, and that nothing lands in 10.0.0.0/16.
func TestNoOverlapAllSlots(t *testing.T) {
	type named struct {
		name string
		p    netip.Prefix
	}
	var all []named
	ports := map[int]Slot{}
	pools := map[string]Slot{}
	for s := Slot(Min); s <= Max; s++ {
		all = append(all, named{fmt.Sprintf("slot %d service", s), s.ServiceSubnet()}, named{fmt.Sprintf("slot %d pod", s), s.PodSubnet()})
		if o, dup := ports[s.APIPort()]; dup {
			t.Errorf("port %d shared by slots %d and %d", s.APIPort(), o, s)
		}
		ports[s.APIPort()] = s
		for _, r := range s.MetalLBRanges("172.30") {
			if o, dup := pools[r]; dup {
				t.Errorf("pool %s shared by %d and %d", r, o, s)
			}
			pools[r] = s
		}
	}
	if len(all) != 198 {
		t.Fatalf("%d subnets", len(all))
	}
	zero := netip.MustParsePrefix("10.0.0.0/16")
	for i := range all {
		if !netip.MustParsePrefix("10.0.0.0/8").Contains(all[i].p.Addr()) || all[i].p.Overlaps(zero) {
			t.Errorf("%s = %s outside 10.1-255", all[i].name, all[i].p)
		}
		for j := i + 1; j < len(all); j++ {
			if all[i].p.Overlaps(all[j].p) {
				t.Errorf("%s %s overlaps %s %s", all[i].name, all[i].p, all[j].name, all[j].p)
			}
		}
	}
}

func TestFromAPIPort(t *testing.T) {
	for s := Slot(Min); s <= Max; s++ {
		if got, ok := FromAPIPort(s.APIPort()); !ok || got != s {
			t.Errorf("round trip %d -> %d", s, got)
		}
	}
	for _, p := range []int{7000, 7100, 6443} {
		if _, ok := FromAPIPort(p); ok {
			t.Errorf("port %d accepted", p)
		}
	}
}

func TestAllocator(t *testing.T) {
	a := NewAllocator([]Slot{1, 3})
	if s, _ := a.Next(); s != 2 {
		t.Errorf("next = %d, want lowest free 2", s)
	}
	if err := a.Reserve(3); err == nil {
		t.Error("reserved a used slot")
	}
	if err := a.Reserve(100); err == nil {
		t.Error("reserved slot 100")
	}
	if err := a.Reserve(5); err != nil {
		t.Fatal(err)
	}
	if s, _ := a.Next(); s != 4 {
		t.Errorf("next = %d, want 4", s)
	}
	if s, _ := a.Next(); s != 6 {
		t.Errorf("next = %d, want 6 (5 pinned)", s)
	}
	full := NewAllocator(nil)
	for i := 0; i < Max; i++ {
		if _, err := full.Next(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := full.Next(); err == nil {
		t.Error("allocated a 100th slot")
	}
}
