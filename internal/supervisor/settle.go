package supervisor

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"
)

// SettledSignal is what the supervisor sends a Command.Settle child once
// the server is up (Supervisor.Settle) and the child is ready: start-up is
// over.
const SettledSignal = syscall.SIGUSR1

// IdleGCPercentEnv overrides DefaultIdleGCPercent for every child (and the
// supervisor itself); "off" keeps the start-up setting.
const IdleGCPercentEnv = "K3SM_IDLE_GOGC"

// DefaultIdleGCPercent is the Go GC target of a settled component. Start-up
// keeps Go's 100 (or $GOGC): it allocates heavily (the apiserver builds its
// OpenAPI specs) and a lower target would slow it. Once settled, a
// component's live heap changes slowly, and 25 keeps the heap it holds
// within 1.25x of what it uses instead of 2x: 30 MiB less PSS for the idle
// server, at a cost in pod-burst latency that bench/RESULTS.md records.
const DefaultIdleGCPercent = 25

// OnSettled is called by a child role first thing (before it can become
// ready, so the signal never meets the default action, which would kill
// it): when the supervisor signals it settled, it lowers its GC target to
// the idle one and returns freed memory to the OS.
func OnSettled() {
	percent, ok := idleGCPercent()
	c := make(chan os.Signal, 1)
	signal.Notify(c, SettledSignal)
	go func() {
		for range c {
			if ok {
				Settle(percent)
			}
			heapProfileLater()
		}
	}()
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

// Settle sets the GC target and returns what the heap no longer uses.
func Settle(percent int) {
	debug.SetGCPercent(percent)
	debug.FreeOSMemory()
}

// SettleSelf settles the calling process (the supervisor, once the server
// is up) as OnSettled would.
func SettleSelf() {
	if percent, ok := idleGCPercent(); ok {
		Settle(percent)
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
