package stats

import (
	"testing"
	"unsafe"
)

func TestRusageInfoV2Layout(t *testing.T) {
	// <sys/resource.h>: 16-byte uuid and 18 uint64 counters.
	if got := unsafe.Sizeof(rusageInfoV2{}); got != 16+18*8 {
		t.Fatalf("rusage_info_v2 is %d bytes, want %d", got, 16+18*8)
	}
}

func TestTicksToNanos(t *testing.T) {
	for _, c := range []struct{ ticks, hz, want uint64 }{
		{24_000_000, 24_000_000, 1_000_000_000},         // 1 s on Apple silicon
		{3, 24_000_000, 125},                            // 125/3 ns a tick
		{1_000, 1_000_000_000, 1_000},                   // Intel: ticks are ns
		{24_000_000 * 86_400, 24_000_000, 86_400 * 1e9}, // a day: past ticks*1e9 overflow
	} {
		if got := ticksToNanos(c.ticks, c.hz); got != c.want {
			t.Errorf("ticksToNanos(%d, %d) = %d, want %d", c.ticks, c.hz, got, c.want)
		}
	}
}
