package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// IdleGCPercentEnv overrides DefaultIdleGCPercent for every child (and the
// supervisor itself); "off" keeps the start-up setting.
const IdleGCPercentEnv = "K3SM_IDLE_GOGC"

// DefaultIdleGCPercent is the Go GC target of a settled component while it
// is idle. Start-up keeps Go's 100 (or $GOGC): it allocates heavily (the
// apiserver builds its OpenAPI specs) and a lower target would slow it.
// Once settled, a component's live heap changes slowly, and 25 keeps the
// heap it holds within 1.25x of what it uses instead of 2x: ~30 MiB less
// PSS for the idle server. While it is busy (a burst of pods) the
// governor (gcGovernor) gives it the start-up target again, and it frees
// memory once it is idle again. bench/RESULTS.md ("Issue 17 notes") has
// the burst figures at each target: they did not differ beyond the
// run-to-run noise of this 2-core machine.
const DefaultIdleGCPercent = 25

// OnSettled is called by a child role at start: when the supervisor tells
// it, on its settle pipe (SettleFDEnv), that start-up is over, it lowers
// its GC target to the idle one and returns freed memory to the OS. A
// process without the pipe (not a Settle child) never settles.
func OnSettled() {
	fd, err := strconv.Atoi(os.Getenv(SettleFDEnv))
	if err != nil || fd < 3 {
		return
	}
	os.Unsetenv(SettleFDEnv)
	// The descriptor must not leak into processes this child starts.
	syscall.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "settle-pipe")
	percent, ok := idleGCPercent()
	go func() {
		defer f.Close()
		var b [1]byte
		if n, _ := f.Read(b[:]); n == 0 {
			return // the supervisor closed it unwritten, or is gone
		}
		if ok {
			settleAndGovern(percent)
		}
		heapProfileLater()
	}()
}

var governOnce sync.Once

// settleAndGovern settles at the idle target and, the first time, starts
// the governor, which restores the start-up target while busy.
func settleAndGovern(idle int) {
	startup := debug.SetGCPercent(idle)
	debug.FreeOSMemory()
	governOnce.Do(func() { go governGC(idle, startup) })
}

// gcSampleEvery is how often the governor reads the allocation rate.
const gcSampleEvery = time.Second

// governGC keeps the settled process at the idle GC target while it
// allocates little, and at its start-up target (Go's 100 unless $GOGC
// said otherwise) while it allocates quickly.
func governGC(idle, busy int) {
	g := newGCGovernor(idle, busy)
	samples := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(samples)
	last := samples[0].Value.Uint64()
	for range time.Tick(gcSampleEvery) {
		metrics.Read(samples)
		allocs, live := samples[0].Value.Uint64(), samples[1].Value.Uint64()
		percent, changed, free := g.step(allocs-last, live)
		last = allocs
		if changed {
			debug.SetGCPercent(percent)
		}
		if free {
			debug.FreeOSMemory()
		}
	}
}

// gcGovernor decides the GC target from each second's allocations against
// the live heap. Busy: a second's allocations exceed a quarter of the live
// heap (at 25 that is a collection every second or more); it switches to
// the busy target at once. Idle again: quietFor seconds in a row allocating
// under 1/32 of the live heap; it switches back and returns what the busy
// heap no longer uses to the OS.
type gcGovernor struct {
	idle, busyPercent int
	busy              bool
	quiet             int // consecutive quiet samples while busy
}

const (
	gcQuietFor  = 20
	gcMinLive   = 4 << 20 // small heaps are judged as if this large, so they do not flap
	gcBusyShift = 2       // busy above live/4 per sample
	gcIdleShift = 5       // quiet below live/32 per sample
)

func newGCGovernor(idle, busy int) *gcGovernor {
	return &gcGovernor{idle: idle, busyPercent: busy}
}

// step takes one sample: bytes allocated since the previous one and the
// live heap. It returns the target, whether it changed, and whether to
// return freed memory now.
func (g *gcGovernor) step(allocated, live uint64) (percent int, changed, free bool) {
	live = max(live, gcMinLive)
	switch {
	case !g.busy && allocated > live>>gcBusyShift:
		g.busy, g.quiet = true, 0
		return g.busyPercent, true, false
	case g.busy && allocated < live>>gcIdleShift:
		g.quiet++
		if g.quiet >= gcQuietFor {
			g.busy, g.quiet = false, 0
			return g.idle, true, true
		}
	case g.busy:
		g.quiet = 0
	}
	if g.busy {
		return g.busyPercent, false, false
	}
	return g.idle, false, false
}

// HeapProfileDirEnv, when set, makes every k3sm process write a heap
// profile (<dir>/<role>-<pid>.heap) a minute after it settled: where the
// idle memory goes (docs/benchmarks.md).
const HeapProfileDirEnv = "K3SM_HEAP_PROFILE_DIR"

func heapProfileLater() {
	dir := os.Getenv(HeapProfileDirEnv)
	if dir == "" {
		return
	}
	role := "k3sm"
	if len(os.Args) > 1 {
		role = filepath.Base(os.Args[1])
	}
	time.AfterFunc(time.Minute, func() {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.heap", role, os.Getpid())))
		if err != nil {
			return
		}
		defer f.Close()
		runtime.GC()
		_ = pprof.Lookup("heap").WriteTo(f, 0)
	})
}

// SettleSelf settles the calling process (the supervisor, once the server
// is up) as OnSettled would.
func SettleSelf() {
	if percent, ok := idleGCPercent(); ok {
		settleAndGovern(percent)
	}
	heapProfileLater()
}

func idleGCPercent() (int, bool) {
	v := os.Getenv(IdleGCPercentEnv)
	switch v {
	case "":
		return DefaultIdleGCPercent, true
	case "off":
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return DefaultIdleGCPercent, true
	}
	return n, true
}
