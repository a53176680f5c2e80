package stats

import (
	"errors"
	"maps"
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

func TestSumGroups(t *testing.T) {
	groups := map[int][]int{10: {10, 11, 12}, 20: {20}, 30: {}}
	list := func(g int) ([]int, error) { return groups[g], nil }
	read := func(pid int) (uint64, uint64, error) {
		if pid == 12 || pid == 20 {
			return 0, 0, errors.New("no such process") // exited after the listing
		}
		return uint64(pid) << 20, uint64(pid) * 1000, nil
	}
	got, err := sumGroups([]int{10, 20, 30}, list, read)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]Sample{10: {CPUNanos: 21000, RSSBytes: 21 << 20, WorkingSetBytes: 21 << 20, Processes: 2}}
	if !maps.Equal(got, want) {
		t.Errorf("sumGroups = %+v, want %+v", got, want)
	}
	if _, err := sumGroups([]int{10}, func(int) ([]int, error) { return nil, errors.New("sysctl refused") }, read); err == nil {
		t.Error("a group that cannot be listed gave a reading")
	}
}
