package supervisor

import "testing"

// The governor: idle target while a process allocates little, the busy one
// at once when a second's allocations pass a quarter of the live heap, and
// back to idle (returning memory) only after 20 quiet seconds in a row.
func TestGCGovernor(t *testing.T) {
	const mib = 1 << 20
	g := newGCGovernor(25, 100)
	live := uint64(100 * mib)
	type want struct {
		percent       int
		changed, free bool
	}
	check := func(what string, allocated uint64, w want) {
		t.Helper()
		p, c, f := g.step(allocated, live)
		if p != w.percent || c != w.changed || f != w.free {
			t.Fatalf("%s: got (%d, %v, %v), want %+v", what, p, c, f, w)
		}
	}
	check("idle", 2*mib, want{25, false, false})
	check("just under busy", 25*mib, want{25, false, false})
	check("a burst begins", 26*mib, want{100, true, false})
	check("still busy", 80*mib, want{100, false, false})
	for i := 0; i < gcQuietFor-1; i++ {
		check("quiet, not yet long enough", mib, want{100, false, false})
	}
	check("moderate allocations reset the quiet count", 10*mib, want{100, false, false})
	for i := 0; i < gcQuietFor-1; i++ {
		check("quiet again", mib, want{100, false, false})
	}
	check("quiet for long enough", mib, want{25, true, true})
	check("idle again", 2*mib, want{25, false, false})

	// A small heap is judged as if it were gcMinLive: 100 kB of
	// allocations are not a burst for a 200 kB heap.
	live = 200 << 10
	check("small heap", 100<<10, want{25, false, false})
	check("small heap, a real burst", gcMinLive, want{100, true, false})
}
