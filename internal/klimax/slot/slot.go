// Package slot owns the per-cluster resource allocation of klimax: each
// cluster gets a slot number N in 1..99 from which its API port, service and
// pod subnets and MetalLB address pool are derived so that no two clusters
// ever collide.
//
// Scheme (N = slot):
//
//	API port        7000+N                (7001..7009 = the reference's 700N; 7010..7099)
//	service subnet  N 1-9:   10.N.0.0/16     (10.1 .. 10.9)
//	                N 10-99: 10.(N+10).0.0/16 (10.20 .. 10.109)
//	pod subnet      N 1-9:   10.(10+N).0.0/16 (10.11 .. 10.19, the reference's 10.1N)
//	                N 10-99: 10.(N+100).0.0/16 (10.110 .. 10.199)
//	MetalLB pool    <a.b>.N.1-<a.b>.N.7 and <a.b>.N.16-<a.b>.N.254 of the kind bridge a.b.0.0/16
//
// The reference used 10.1N for every N, so slot N's pod subnet equalled slot
// N+10's service subnet (10.1N == 10.(10+N)); the second-octet ranges above
// (1-9, 11-19, 20-109, 110-199) are disjoint, which TestNoOverlapAllSlots proves.
package slot

import (
	"fmt"
	"net/netip"
	"sort"
)

// Min and Max bound slot numbers.
const (
	Min = 1
	Max = 99
)

// BaseAPIPort + N is the host port of slot N's API server.
const BaseAPIPort = 7000

// Slot is one cluster allocation.
type Slot int

// Valid reports whether s is within 1..99.
func (s Slot) Valid() bool { return s >= Min && s <= Max }

// APIPort is the host (or VM) port the cluster's API server is published on.
func (s Slot) APIPort() int { return BaseAPIPort + int(s) }

// ServiceSubnet is the cluster's Service CIDR.
func (s Slot) ServiceSubnet() netip.Prefix {
	if s <= 9 {
		return sixteen(int(s))
	}
	return sixteen(int(s) + 10)
}

// PodSubnet is the cluster's Pod CIDR.
func (s Slot) PodSubnet() netip.Prefix {
	if s <= 9 {
		return sixteen(10 + int(s))
	}
	return sixteen(int(s) + 100)
}

func sixteen(b int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(b), 0, 0}), 16)
}

// MetalLBRanges returns the two LoadBalancer address ranges of slot s within
// the kind bridge /16 whose first two octets are bridgePrefix (e.g. "172.30").
// .8-.15 are left out so that future per-cluster infrastructure has room.
func (s Slot) MetalLBRanges(bridgePrefix string) []string {
	return []string{
		fmt.Sprintf("%s.%d.1-%s.%d.7", bridgePrefix, s, bridgePrefix, s),
		fmt.Sprintf("%s.%d.16-%s.%d.254", bridgePrefix, s, bridgePrefix, s),
	}
}

// FromAPIPort recovers the slot from a published API server port, so the slot
// of an existing cluster can be read from its node container alone.
func FromAPIPort(port int) (Slot, bool) {
	s := Slot(port - BaseAPIPort)
	return s, s.Valid()
}

// Allocator hands out slots given the ones already in use.
type Allocator struct {
	used map[Slot]bool
}

// NewAllocator starts from the slots of existing clusters.
func NewAllocator(used []Slot) *Allocator {
	a := &Allocator{used: map[Slot]bool{}}
	for _, s := range used {
		a.used[s] = true
	}
	return a
}

// Reserve claims a pinned slot; it fails when the slot is out of range or taken.
func (a *Allocator) Reserve(s Slot) error {
	if !s.Valid() {
		return fmt.Errorf("slot %d is out of range (use %d-%d)", s, Min, Max)
	}
	if a.used[s] {
		return fmt.Errorf("slot %d is already in use (pick another num, or let klimax choose)", s)
	}
	a.used[s] = true
	return nil
}

// Next claims the lowest free slot.
func (a *Allocator) Next() (Slot, error) {
	for s := Slot(Min); s <= Max; s++ {
		if !a.used[s] {
			a.used[s] = true
			return s, nil
		}
	}
	return 0, fmt.Errorf("all %d slots are in use; delete a cluster first", Max)
}

// Used lists claimed slots in order.
func (a *Allocator) Used() []Slot {
	out := make([]Slot, 0, len(a.used))
	for s := range a.used {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
