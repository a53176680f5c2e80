package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// watcher collects the watch stream's events.
type watcher struct {
	mu     sync.Mutex
	events []*runtimev1.PodEvent
	cancel func()
}

func (e *env) watch() *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{cancel: cancel}
	stream, err := e.c.Runtime.WatchPodStatus(ctx, &runtimev1.WatchPodStatusRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	synced := make(chan struct{})
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if m.GetKind() == runtimev1.WatchPodStatusResponse_KIND_SYNCED {
				close(synced)
			}
			if ev := m.GetEvent(); ev != nil {
				w.mu.Lock()
				w.events = append(w.events, ev)
				w.mu.Unlock()
			}
		}
	}()
	<-synced
	e.t.Cleanup(cancel)
	return w
}

func (w *watcher) find(uid, reason string) []*runtimev1.PodEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*runtimev1.PodEvent
	for _, ev := range w.events {
		if ev.GetPodUid() == uid && ev.GetReason() == reason {
			out = append(out, ev)
		}
	}
	return out
}

func (w *watcher) waitFor(t *testing.T, uid, reason, substr string) *runtimev1.PodEvent {
	t.Helper()
	var found *runtimev1.PodEvent
	poll.Until(t, 10*time.Second, fmt.Sprintf("a %s event containing %q for pod %s", reason, substr, uid), func() bool {
		for _, ev := range w.find(uid, reason) {
			if strings.Contains(ev.GetMessage(), substr) {
				found = ev
				return true
			}
		}
		return false
	})
	return found
}

func ctrState(st *runtimev1.PodStatus) *runtimev1.ContainerStatus {
	return st.GetContainerStatuses()[0]
}

// A container that keeps crashing restarts at once, then after growing
// back-offs (200ms, 400ms, 800ms cap in tests; 10s..300s by default), shows
// CrashLoopBackOff in between, and keeps the previous attempt's log.
func TestIntegrationCrashLoopBackOff(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	spec := e.podSpec("crasher", "echo:run", "err:crashing", "exit:1")
	e.create(spec)
	// The back-off counts from the previous attempt's exit, so it is
	// measured from there: each CrashLoopBackOff seen names its delay and
	// shows the attempt it follows; the next attempt's start comes from a
	// later status. Gaps between Started events would not do: a crasher
	// may exit before its Started event is out.
	waits := map[time.Time]time.Duration{} // finishedAt -> announced back-off
	var starts []time.Time
	st := e.waitFor(spec.Uid, "restartCount 5", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		cs := ctrState(st)
		if r := cs.GetState().GetRunning(); r != nil {
			starts = append(starts, r.GetStartedAt().AsTime())
		}
		for _, tm := range []*runtimev1.ContainerStateTerminated{cs.GetState().GetTerminated(), cs.GetLastTerminationState().GetTerminated()} {
			if tm != nil {
				starts = append(starts, tm.GetStartedAt().AsTime())
			}
		}
		if wt := cs.GetState().GetWaiting(); wt != nil && wt.GetReason() == "CrashLoopBackOff" {
			f := append(strings.Fields(wt.GetMessage()), "", "")
			d, err := time.ParseDuration(f[1])
			if f[0] != "back-off" || err != nil || !strings.Contains(wt.GetMessage(), "restarting failed container=main") {
				t.Errorf("CrashLoopBackOff message %q", wt.GetMessage())
			} else if lt := cs.GetLastTerminationState().GetTerminated(); lt != nil {
				waits[lt.GetFinishedAt().AsTime()] = d
			}
		}
		return cs.GetRestartCount() >= 5
	})
	if len(waits) == 0 {
		t.Error("never saw the CrashLoopBackOff waiting reason")
	}
	// Each back-off seen: the next start after that exit came no sooner
	// than announced, and not much later.
	seen := map[time.Duration]bool{}
	for fin, d := range waits {
		var next time.Time
		for _, s := range starts {
			if s.After(fin) && (next.IsZero() || s.Before(next)) {
				next = s
			}
		}
		if next.IsZero() {
			continue // the last back-off still running when the wait ended
		}
		seen[d] = true
		if got := next.Sub(fin); got < d || got > d+time.Second {
			t.Errorf("restart %s after the exit, announced back-off %s", got, d)
		} else {
			t.Logf("restart %s after the exit, announced back-off %s", got, d)
		}
	}
	for _, d := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond} {
		if !seen[d] {
			t.Errorf("no restart measured after a back-off of %s; back-offs seen: %v", d, waits)
		}
	}
	if st.GetPhase() != runtimev1.PodPhase_POD_PHASE_RUNNING {
		t.Errorf("a crash-looping pod with restartPolicy Always is Running, got %v", st.GetPhase())
	}
	lt := ctrState(st).GetLastTerminationState().GetTerminated()
	if lt.GetExitCode() != 1 || lt.GetReason() != "Error" {
		t.Errorf("last termination %v", lt)
	}
	started := w.find(spec.Uid, "Started")
	if len(started) < 5 {
		t.Fatalf("%d Started events", len(started))
	}
	var gaps []time.Duration
	for i := 1; i < 5; i++ {
		gaps = append(gaps, started[i].GetTime().AsTime().Sub(started[i-1].GetTime().AsTime()))
	}
	t.Logf("gaps between starts: %v", gaps)
	// No back-off: the gap is one start of the container (in the sandbox:
	// the shim, its init and the workload), which a loaded CI machine
	// stretches to a few hundred ms.
	if gaps[0] > 600*time.Millisecond {
		t.Errorf("first restart should be immediate, took %s", gaps[0])
	}
	// Back-offs grow: the gaps between starts do too, give or take one
	// start's time.
	if gaps[3] < gaps[1] {
		t.Errorf("back-offs did not grow: gaps between starts %v", gaps)
	}
	if len(w.find(spec.Uid, "BackOff")) == 0 {
		t.Error("no BackOff event")
	}
	prev, err := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid, Previous: true})
	if err != nil || !strings.Contains(prev, "run\n") || !strings.Contains(prev, "crashing\n") {
		t.Errorf("previous log %q %v", prev, err)
	}
	// kubectl logs (not --previous) while it waits in CrashLoopBackOff
	// prints the last terminated attempt's log, as the kubelet serves it,
	// never "waiting to start".
	poll.Every(t, context.Background(), 2500*time.Millisecond, 50*time.Millisecond, "the last attempt's log read while the container waits in CrashLoopBackOff", func() error {
		st, err := e.c.Runtime.GetPodStatus(context.Background(), &runtimev1.GetPodStatusRequest{Uid: spec.Uid})
		if err != nil {
			t.Fatal(err)
		}
		if r := ctrState(st.GetStatus()).GetState().GetWaiting().GetReason(); r != "CrashLoopBackOff" {
			return fmt.Errorf("waiting reason %q", r)
		}
		cur, err := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid})
		if err != nil {
			t.Fatalf("logs of a container in CrashLoopBackOff: %v", err)
		}
		if !strings.Contains(cur, "crashing\n") {
			return fmt.Errorf("log %q", cur)
		}
		return nil
	})
}

func TestIntegrationJobsSucceedAndFail(t *testing.T) {
	e := newEnv(t)
	ok := e.podSpec("job-ok", "echo:working", "exit:0")
	ok.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	bad := e.podSpec("job-bad", "exit:3")
	bad.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	marker := filepath.Join(t.TempDir(), "failed-once")
	retry := e.podSpec("job-retry", "failonce:"+marker, "echo:second try", "exit:0")
	retry.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_ON_FAILURE
	for _, s := range []*runtimev1.PodSpec{ok, bad, retry} {
		e.create(s)
	}
	terminal := func(st *runtimev1.PodStatus) bool {
		return st.GetPhase() == runtimev1.PodPhase_POD_PHASE_SUCCEEDED || st.GetPhase() == runtimev1.PodPhase_POD_PHASE_FAILED
	}
	st := e.waitFor(ok.Uid, "terminal", 30*time.Second, terminal)
	if tm := ctrState(st).GetState().GetTerminated(); st.GetPhase() != runtimev1.PodPhase_POD_PHASE_SUCCEEDED || tm.GetExitCode() != 0 || tm.GetReason() != "Completed" {
		t.Errorf("job-ok: %s", prettyStatus(st))
	}
	st = e.waitFor(bad.Uid, "terminal", 30*time.Second, terminal)
	if tm := ctrState(st).GetState().GetTerminated(); st.GetPhase() != runtimev1.PodPhase_POD_PHASE_FAILED || tm.GetExitCode() != 3 || tm.GetReason() != "Error" {
		t.Errorf("job-bad: %s", prettyStatus(st))
	}
	st = e.waitFor(retry.Uid, "terminal", 30*time.Second, terminal)
	cs := ctrState(st)
	if st.GetPhase() != runtimev1.PodPhase_POD_PHASE_SUCCEEDED || cs.GetRestartCount() != 1 || cs.GetLastTerminationState().GetTerminated().GetExitCode() != 1 {
		t.Errorf("job-retry: %s", prettyStatus(st))
	}
	// A finished job stays put: no restart later.
	time.Sleep(500 * time.Millisecond)
	if st := e.status(ok.Uid); ctrState(st).GetRestartCount() != 0 || st.GetPhase() != runtimev1.PodPhase_POD_PHASE_SUCCEEDED {
		t.Errorf("job-ok changed after completing: %s", prettyStatus(st))
	}
	if l, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: ok.Uid}); l != "working\n" {
		t.Errorf("job-ok log %q", l)
	}
}

func TestIntegrationInitContainersInOrder(t *testing.T) {
	e := newEnv(t)
	trace := filepath.Join(t.TempDir(), "trace")
	spec := e.podSpec("with-init", "append:"+trace+":main", "forever")
	spec.InitContainers = []*runtimev1.ContainerSpec{
		{Name: "init-1", Image: e.image, Args: []string{"sleep:200ms", "append:" + trace + ":init-1"}},
		{Name: "init-2", Image: e.image, Args: []string{"append:" + trace + ":init-2"}},
	}
	e.create(spec)
	// While init-1 runs the pod is Pending and not initialized.
	st := e.waitFor(spec.Uid, "init-1 running", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return st.GetInitContainerStatuses()[0].GetState().GetRunning() != nil
	})
	if st.GetPhase() != runtimev1.PodPhase_POD_PHASE_PENDING || st.GetInitialized() || ctrState(st).GetState().GetRunning() != nil {
		t.Errorf("during init: %s", prettyStatus(st))
	}
	st = e.waitFor(spec.Uid, "Running", 30*time.Second, running)
	if !st.GetInitialized() {
		t.Error("not initialized after the init containers completed")
	}
	for _, ic := range st.GetInitContainerStatuses() {
		if ic.GetState().GetTerminated().GetReason() != "Completed" {
			t.Errorf("init container %s: %v", ic.GetName(), ic.GetState())
		}
	}
	poll.UntilNil(t, 5*time.Second, "init-1, init-2, main in order in the trace", func() error {
		if b, _ := os.ReadFile(trace); string(b) != "init-1\ninit-2\nmain\n" {
			return fmt.Errorf("trace %q", b)
		}
		return nil
	})

	// A failing init container with restartPolicy Never fails the pod and
	// the containers never start.
	spec2 := e.podSpec("init-fails", "append:"+trace+":should-not-run")
	spec2.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	spec2.InitContainers = []*runtimev1.ContainerSpec{{Name: "init", Image: e.image, Args: []string{"exit:7"}}}
	e.create(spec2)
	st = e.waitFor(spec2.Uid, "Failed", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return st.GetPhase() == runtimev1.PodPhase_POD_PHASE_FAILED
	})
	if st.GetInitContainerStatuses()[0].GetState().GetTerminated().GetExitCode() != 7 || ctrState(st).GetState().GetWaiting() == nil {
		t.Errorf("init failure: %s", prettyStatus(st))
	}
	time.Sleep(300 * time.Millisecond)
	if b, _ := os.ReadFile(trace); strings.Contains(string(b), "should-not-run") {
		t.Error("the container ran although its init container failed")
	}
}

func TestIntegrationGracefulTermination(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	tmp := t.TempDir()
	// Handles SIGTERM: gets it, takes 500ms, exits before the grace period.
	polite := e.podSpec("polite", "pid:"+filepath.Join(tmp, "polite.pid"), "trapfile:"+filepath.Join(tmp, "polite.term")+":500ms", "forever")
	polite.TerminationGracePeriodSeconds = ptr(int64(5))
	// Ignores SIGTERM: killed with SIGKILL when the 1 s grace runs out.
	stubborn := e.podSpec("stubborn", "pid:"+filepath.Join(tmp, "stubborn.pid"), "ignore", "forever")
	stubborn.TerminationGracePeriodSeconds = ptr(int64(1))
	e.create(polite)
	e.create(stubborn)
	e.waitFor(polite.Uid, "Running", 30*time.Second, running)
	e.waitFor(stubborn.Uid, "Running", 30*time.Second, running)
	politePid := readPid(t, filepath.Join(tmp, "polite.pid"))
	stubbornPid := readPid(t, filepath.Join(tmp, "stubborn.pid"))

	ctx := context.Background()
	t0 := time.Now()
	if _, err := e.c.Runtime.DeletePod(ctx, &runtimev1.DeletePodRequest{Uid: polite.Uid, Wait: true}); err != nil {
		t.Fatal(err)
	}
	d := time.Since(t0)
	if b, _ := os.ReadFile(filepath.Join(tmp, "polite.term")); string(b) != "got SIGTERM\n" {
		t.Errorf("SIGTERM not delivered: %q", b)
	}
	if d < 500*time.Millisecond || d > 3*time.Second {
		t.Errorf("polite pod took %s to stop, want about 500ms (its own shutdown)", d)
	}
	if processAlive(politePid) {
		t.Error("polite process still alive")
	}
	w.waitFor(t, polite.Uid, "Killing", "Stopping container main")

	t0 = time.Now()
	if _, err := e.c.Runtime.DeletePod(ctx, &runtimev1.DeletePodRequest{Uid: stubborn.Uid, Wait: true}); err != nil {
		t.Fatal(err)
	}
	d = time.Since(t0)
	if d < time.Second || d > 3*time.Second {
		t.Errorf("stubborn pod took %s to stop, want the 1s grace period then SIGKILL", d)
	}
	if processAlive(stubbornPid) {
		t.Error("stubborn process survived SIGKILL")
	}
	if _, err := os.Stat(filepath.Join(e.dir, "pods", stubborn.Uid)); !os.IsNotExist(err) {
		t.Errorf("pod directory left behind: %v", err)
	}
}

// kill -9 of the daemon leaves pods running; a new daemon re-attaches
// without restarting them and learns exits that happened meanwhile.
func TestIntegrationDaemonKill9Reattach(t *testing.T) {
	e := newSubprocessEnv(t)
	dir := e.dir
	d1 := e.startSubprocess()
	t.Cleanup(func() {
		e.deleteAll()
		os.RemoveAll(dir)
	})

	tmp := t.TempDir()
	long := e.podSpec("long-running", "pid:"+filepath.Join(tmp, "long.pid"), "echo:started", "forever")
	crashy := e.podSpec("crashy", "exit:1") // restartCount > 0 before the kill
	short := e.podSpec("short", "sleep:1500ms", "exit:4")
	short.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	for _, s := range []*runtimev1.PodSpec{long, crashy, short} {
		e.create(s)
	}
	e.waitFor(long.Uid, "Running", 30*time.Second, running)
	e.waitFor(short.Uid, "Running", 30*time.Second, running)
	e.waitFor(crashy.Uid, "restarts", 30*time.Second, func(st *runtimev1.PodStatus) bool { return ctrState(st).GetRestartCount() >= 2 })
	pid := readPid(t, filepath.Join(tmp, "long.pid"))
	before := e.status(long.Uid)

	// kill -9 the daemon.
	d1.Process.Signal(syscall.SIGKILL)
	e.c.Close()
	time.Sleep(2 * time.Second) // "short" exits while no daemon runs
	if !processAlive(pid) {
		t.Fatal("the pod's process died with the daemon")
	}

	d2 := e.startSubprocess()
	defer func() {
		e.deleteAll() // while a daemon still runs
		d2.Process.Signal(syscall.SIGTERM)
	}()
	w := e.watch()
	w.waitFor(t, long.Uid, "PodReattached", "re-attached to 1 running container")
	after := e.status(long.Uid)
	if !running(after) || ctrState(after).GetRestartCount() != ctrState(before).GetRestartCount() ||
		ctrState(after).GetContainerId() != ctrState(before).GetContainerId() {
		t.Errorf("after re-attach:\n%s\nbefore:\n%s", prettyStatus(after), prettyStatus(before))
	}
	if !processAlive(pid) {
		t.Error("re-attaching restarted the process")
	}
	if got := readPid(t, filepath.Join(tmp, "long.pid")); got != pid {
		t.Errorf("pid changed %d -> %d: the container was recreated", pid, got)
	}
	if l, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: long.Uid}); l != "started\n" {
		t.Errorf("log after re-attach %q", l)
	}
	st := e.waitFor(short.Uid, "Failed with the exit code recorded while no daemon ran", 10*time.Second, func(st *runtimev1.PodStatus) bool {
		return st.GetPhase() == runtimev1.PodPhase_POD_PHASE_FAILED
	})
	if tm := ctrState(st).GetState().GetTerminated(); tm.GetExitCode() != 4 || tm.GetReason() != "Error" {
		t.Errorf("short pod: %s", prettyStatus(st))
	}
	// The crash-looping pod keeps counting from where it was.
	st = e.status(crashy.Uid)
	if ctrState(st).GetRestartCount() < 2 {
		t.Errorf("crashy restartCount went back: %s", prettyStatus(st))
	}
	// Deleting through the new daemon stops the re-attached process.
	zero := int64(0)
	if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: long.Uid, GracePeriodSeconds: &zero, Wait: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if processAlive(pid) {
		t.Error("deleting a re-attached pod left its process")
	}
}

func TestIntegrationImageErrors(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	foreign, _ := imagetest.Image(progBin, imagetest.ForeignPlatform())
	foreignRef := e.reg.Push(t, "foreign:v1", foreign)

	cases := []struct {
		name, image string
		policy      runtimev1.PullPolicy
		first, then string
		msg         string
	}{
		{"foreign", foreignRef, 0, "ErrImagePull", "ImagePullBackOff", "not for this node's platform"},
		{"missing", e.reg.Host + "/nope:v1", 0, "ErrImagePull", "ImagePullBackOff", "not found"},
		{"never", e.reg.Host + "/absent:v1", runtimev1.PullPolicy_PULL_POLICY_NEVER, "ErrImageNeverPull", "ErrImageNeverPull", "is not present with pull policy of Never"},
		{"invalid", "Not A Valid::Name", 0, "InvalidImageName", "InvalidImageName", "couldn't parse image name"},
	}
	for _, c := range cases {
		spec := e.podSpec("img-" + c.name)
		spec.Containers[0].Image = c.image
		spec.Containers[0].ImagePullPolicy = c.policy
		e.create(spec)
		seen := map[string]string{}
		e.waitFor(spec.Uid, c.then+" after "+c.first, 20*time.Second, func(st *runtimev1.PodStatus) bool {
			if wt := ctrState(st).GetState().GetWaiting(); wt != nil {
				seen[wt.GetReason()] = wt.GetMessage()
			}
			_, a := seen[c.first]
			_, b := seen[c.then]
			return (a || c.first == "ErrImagePull") && b
		})
		if st := e.status(spec.Uid); st.GetPhase() != runtimev1.PodPhase_POD_PHASE_PENDING {
			t.Errorf("%s: phase %v, want Pending", c.name, st.GetPhase())
		}
		if !strings.Contains(seen[c.then], c.msg) {
			t.Errorf("%s: %s message %q lacks %q", c.name, c.then, seen[c.then], c.msg)
		}
		if c.first == "ErrImagePull" {
			w.waitFor(t, spec.Uid, "Failed", "Error: ErrImagePull")
			w.waitFor(t, spec.Uid, "BackOff", "Back-off pulling image")
		}
	}
	// The pull back-off retries: push the missing image and the pod starts.
	img, _ := imagetest.Image(progBin, v1.Platform{})
	late := e.podSpec("late")
	late.Containers[0].Image = e.reg.Host + "/late:v1"
	e.create(late)
	e.waitFor(late.Uid, "ErrImagePull", 20*time.Second, func(st *runtimev1.PodStatus) bool {
		return ctrState(st).GetState().GetWaiting().GetReason() == "ImagePullBackOff"
	})
	e.reg.Push(t, "late:v1", img)
	e.waitFor(late.Uid, "Running once the image exists", 20*time.Second, running)
}

func TestIntegrationDelete20PodsLeavesNothing(t *testing.T) {
	e := newEnv(t)
	tmp := t.TempDir()
	var specs []*runtimev1.PodSpec
	for i := 0; i < 20; i++ {
		s := e.podSpec(fmt.Sprintf("many-%02d", i), "pid:"+filepath.Join(tmp, fmt.Sprintf("%d.pid", i)), "forever")
		// Each pod also forks a child into its process group.
		s.Containers = append(s.Containers, &runtimev1.ContainerSpec{Name: "sidecar", Image: "native",
			Command: []string{"/bin/sh", "-c", "sleep 1000 & echo $! " + imagetest.PidNSSuffix + " > " + filepath.Join(tmp, fmt.Sprintf("%d.child", i)) + "; wait"}})
		specs = append(specs, s)
		e.create(s)
	}
	var pids []int
	for i, s := range specs {
		e.waitFor(s.Uid, "Running", 60*time.Second, running)
		pids = append(pids, readPid(t, filepath.Join(tmp, fmt.Sprintf("%d.pid", i))), readPid(t, filepath.Join(tmp, fmt.Sprintf("%d.child", i))))
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, s := range specs {
		wg.Add(1)
		go func(uid string) {
			defer wg.Done()
			if _, err := e.c.Runtime.DeletePod(ctx, &runtimev1.DeletePodRequest{Uid: uid, Wait: true}); err != nil {
				t.Error(err)
			}
		}(s.Uid)
	}
	wg.Wait()
	for _, pid := range pids {
		if processAlive(pid) {
			t.Errorf("process %d survived its pod's deletion", pid)
		}
	}
	for _, sub := range []string{"pods", "logs/pods", "run/shims"} {
		ents, _ := os.ReadDir(filepath.Join(e.dir, sub))
		if len(ents) != 0 {
			t.Errorf("%s not empty after deleting every pod: %d entries", sub, len(ents))
		}
	}
	// No shim is left either: none has a command line naming this data dir.
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), e.dir+"/") && strings.Contains(string(b), "k3sm-shim") {
			t.Errorf("shim still running: pid %s %q", p.Name(), b)
		}
	}
	if r, _ := e.c.Runtime.ListPods(ctx, &runtimev1.ListPodsRequest{}); len(r.GetPods()) != 0 {
		t.Errorf("%d pods listed", len(r.GetPods()))
	}
}

// A shim killed with SIGKILL loses the exit status: the container is
// reported ExitStatusUnknown, its orphaned processes are ended, and the
// restart policy starts it again.
func TestIntegrationShimDeathIsExitStatusUnknown(t *testing.T) {
	e := newEnv(t)
	tmp := t.TempDir()
	spec := e.podSpec("shim-dies", "pid:"+filepath.Join(tmp, "pid"), "forever")
	e.create(spec)
	e.waitFor(spec.Uid, "Running", 30*time.Second, running)
	pid := readPid(t, filepath.Join(tmp, "pid"))
	os.Remove(filepath.Join(tmp, "pid"))
	b, err := os.ReadFile(filepath.Join(e.dir, "pods", spec.Uid, "attempts", "main", "0", "shim.json"))
	if err != nil {
		t.Fatal(err)
	}
	var shimPid int
	fmt.Sscanf(string(b)[strings.Index(string(b), `"shimPid":`)+len(`"shimPid":`):], "%d", &shimPid)
	if err := syscall.Kill(shimPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st := e.waitFor(spec.Uid, "restarted after the shim died", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return ctrState(st).GetRestartCount() == 1 && running(st)
	})
	if lt := ctrState(st).GetLastTerminationState().GetTerminated(); lt.GetReason() != "ExitStatusUnknown" {
		t.Errorf("last termination %v, want ExitStatusUnknown", lt)
	}
	time.Sleep(100 * time.Millisecond)
	if processAlive(pid) {
		t.Error("the orphaned workload of the dead shim still runs")
	}
	if readPid(t, filepath.Join(tmp, "pid")) == pid {
		t.Error("no new process after the restart")
	}
}

// A daemon that stops (SIGTERM: the server stopping) while a deleted pod's
// grace period runs stops at once, not after the grace period; the pod's
// process, which ignores SIGTERM, still dies when its grace period ends,
// with no daemon left to kill it: the shim holds the deadline.
func TestIntegrationDeleteThenDaemonStops(t *testing.T) {
	e := newSubprocessEnv(t)
	dir := e.dir
	d1 := e.startSubprocess()
	t.Cleanup(func() { os.RemoveAll(dir) })
	tmp := t.TempDir()
	stubborn := e.podSpec("stubborn", "pid:"+filepath.Join(tmp, "stubborn.pid"), "ignore", "forever")
	stubborn.TerminationGracePeriodSeconds = ptr(int64(4))
	e.create(stubborn)
	e.waitFor(stubborn.Uid, "Running", 30*time.Second, running)
	pid := readPid(t, filepath.Join(tmp, "stubborn.pid"))

	t0 := time.Now()
	if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: stubborn.Uid}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // SIGTERM sent, ignored
	e.c.Close()
	d1.Process.Signal(syscall.SIGTERM)
	if err := <-e.daemonExited; err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
	if d := time.Since(t0); d > 2500*time.Millisecond {
		t.Errorf("the daemon took %s to stop (%s after the delete): it waited for the pod's grace period", d, d)
	}
	if !processAlive(pid) {
		t.Fatal("the pod's process died before its grace period ended")
	}
	// Not poll: this times the kill, which the check below reports on (Errorf).
	for processAlive(pid) && time.Since(t0) < 10*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	if d := time.Since(t0); processAlive(pid) || d < 4*time.Second || d > 6*time.Second {
		t.Errorf("the deleted pod's process: alive %v %s after the delete; want killed at its 4s grace period", processAlive(pid), d)
	}
	// The next daemon finishes the delete.
	d2 := e.startSubprocess()
	defer d2.Process.Signal(syscall.SIGTERM)
	zero := int64(0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := e.c.Runtime.DeletePod(ctx, &runtimev1.DeletePodRequest{Uid: stubborn.Uid, GracePeriodSeconds: &zero, Wait: true}); err != nil && status.Code(err) != codes.NotFound {
		t.Errorf("delete through the next daemon: %v", err)
	}
}
