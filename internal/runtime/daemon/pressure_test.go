package daemon

import (
	"strings"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/pressure"
)

// newPressureEnv is newEnv, its daemon watching no memory threshold yet.
func newPressureEnv(t *testing.T) *env {
	integration(t)
	if _, err := pressure.ReadMemory(); err != nil {
		t.Skip(err)
	}
	return newEnv(t)
}

// startWithThreshold starts the daemon in process with a memory.available
// threshold checked every interval.
func (e *env) startWithThreshold(th *pressure.Threshold, interval time.Duration) {
	e.startInProcessWith(func(cfg *Config) { cfg.MemoryThreshold, cfg.HousekeepingInterval = th, interval })
}

func evicted(st *runtimev1.PodStatus) bool { return st.GetReason() == "Evicted" }

// Under memory.available the daemon evicts one pod per check through the
// eviction path: the pod above its request first, an Evicted event with
// the kubelet's message, containers stopped, phase Failed; a finished pod
// is not a candidate.
func TestIntegrationMemoryEviction(t *testing.T) {
	const interval = 700 * time.Millisecond
	e := newPressureEnv(t)
	done := e.podSpec("done", "exit:0")
	done.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	e.create(done)
	e.waitFor(done.Uid, "Succeeded", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return st.GetPhase() == runtimev1.PodPhase_POD_PHASE_SUCCEEDED
	})
	within := e.podSpec("within", "forever")
	within.Containers[0].Resources = &runtimev1.Resources{MemoryRequestBytes: 1 << 30}
	hog := e.podSpec("hog", "alloc:64Mi", "forever")
	e.create(within)
	e.create(hog)
	e.waitFor(hog.Uid, "Running", 30*time.Second, running)
	e.waitFor(within.Uid, "Running", 30*time.Second, running)
	e.waitLog(hog.Uid, "allocated")
	// The daemon again, now with a threshold the machine is always below
	// (100 % of its memory); the pods keep running.
	e.stop()
	e.startWithThreshold(&pressure.Threshold{Percent: 100}, interval)
	w := e.watch()
	st := e.waitFor(hog.Uid, "evicted", 30*time.Second, evicted)
	if s := e.status(within.Uid); evicted(s) {
		t.Fatalf("the pod within its request was evicted with the one above it: %s", prettyStatus(s))
	}
	hogAt := time.Now()
	if !strings.HasPrefix(st.GetMessage(), "The node was low on resource: memory. Threshold quantity: ") ||
		!strings.Contains(st.GetMessage(), "Container main was using ") || !strings.HasSuffix(st.GetMessage(), "request is 0, has larger consumption of memory. ") {
		t.Errorf("message %q", st.GetMessage())
	}
	ev := w.waitFor(t, hog.Uid, "Evicted", "The node was low on resource: memory.")
	if ev.GetType() != runtimev1.EventType_EVENT_TYPE_WARNING || ev.GetMessage() != st.GetMessage() {
		t.Errorf("event %+v, status message %q", ev, st.GetMessage())
	}
	e.waitFor(hog.Uid, "Failed", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return st.GetPhase() == runtimev1.PodPhase_POD_PHASE_FAILED && st.GetContainerStatuses()[0].GetState().GetTerminated() != nil
	})
	e.waitFor(within.Uid, "evicted", 30*time.Second, evicted)
	if d := time.Since(hogAt); d < interval/2 {
		t.Errorf("second eviction %s after the first: one per check, every %s", d, interval)
	}
	time.Sleep(2 * interval)
	if s := e.status(done.Uid); evicted(s) || s.GetPhase() != runtimev1.PodPhase_POD_PHASE_SUCCEEDED {
		t.Errorf("a finished pod was evicted: %s", prettyStatus(s))
	}
	if n := len(w.find(hog.Uid, "Evicted")); n != 1 {
		t.Errorf("%d Evicted events for one eviction", n)
	}
}
