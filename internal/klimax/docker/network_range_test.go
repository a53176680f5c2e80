package docker

import (
	"net/netip"
	"testing"
)

func TestContainerRangeStaysOutOfMetalLBPools(t *testing.T) {
	spec := NetworkSpec{Name: "kind", Subnet: netip.MustParsePrefix("172.30.0.0/16")}
	r := spec.ContainerRange()
	if r.String() != "172.30.0.0/24" {
		t.Fatalf("container range %s", r)
	}
	for n := 1; n <= 99; n++ {
		pool := netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 30, byte(n), 0}), 24)
		if r.Overlaps(pool) {
			t.Fatalf("container range overlaps slot %d's pool %s", n, pool)
		}
	}
	if !r.Contains(spec.Gateway()) {
		t.Fatalf("gateway %s outside the container range", spec.Gateway())
	}
}
