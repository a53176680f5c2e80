package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// healthServer is a real gRPC health service on 127.0.0.1 (pods share the
// node's network, so a probe of the pod's port reaches it the same way).
func healthServer(t *testing.T) (*health.Server, int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	h := health.NewServer()
	healthpb.RegisterHealthServer(s, h)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return h, l.Addr().(*net.TCPAddr).Port
}

// fastProbe is a probe every second that flips after one result.
func fastProbe(p *runtimev1.Probe) *runtimev1.Probe {
	p.PeriodSeconds, p.TimeoutSeconds, p.FailureThreshold, p.SuccessThreshold = 1, 1, 1, 1
	return p
}

func execProbe(cmd ...string) *runtimev1.Probe {
	return &runtimev1.Probe{Handler: &runtimev1.Probe_Exec{Exec: &runtimev1.ExecAction{Command: cmd}}}
}
func httpProbe(port int, path string) *runtimev1.Probe {
	return &runtimev1.Probe{Handler: &runtimev1.Probe_HttpGet{HttpGet: &runtimev1.HTTPGetAction{Port: int32(port), Path: path}}}
}
func tcpProbe(port int) *runtimev1.Probe {
	return &runtimev1.Probe{Handler: &runtimev1.Probe_TcpSocket{TcpSocket: &runtimev1.TCPSocketAction{Port: int32(port)}}}
}
func grpcProbe(port int) *runtimev1.Probe {
	return &runtimev1.Probe{Handler: &runtimev1.Probe_Grpc{Grpc: &runtimev1.GRPCAction{Port: int32(port)}}}
}

func statusOf(st *runtimev1.PodStatus, name string) *runtimev1.ContainerStatus {
	for _, cs := range append(append([]*runtimev1.ContainerStatus{}, st.GetInitContainerStatuses()...), st.GetContainerStatuses()...) {
		if cs.GetName() == name {
			return cs
		}
	}
	return nil
}

// waitFile waits until the file at path has the line want.
func waitFile(t *testing.T, path, want string) {
	t.Helper()
	poll.UntilNil(t, 10*time.Second, fmt.Sprintf("%q in %s", want, path), func() error {
		if l := readLines(path); !slices.Contains(l, want) {
			return fmt.Errorf("it has %v", l)
		}
		return nil
	})
}

func readLines(path string) []string {
	b, _ := os.ReadFile(path)
	return strings.Fields(string(b))
}

// Readiness of each probe kind: all pass, the pod is ready; each kind's
// target fails, its container (and the pod) turns not ready with the
// kubelet's Unhealthy event; the targets recover, ready again.
func TestIntegrationReadinessProbeKinds(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	dir := t.TempDir()
	flag := filepath.Join(dir, "fail")
	httpPort, tcpPort := freePort(t), freePort(t)
	hs, grpcPort := healthServer(t)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	spec := e.podSpec("ready")
	spec.Containers = []*runtimev1.ContainerSpec{
		{Name: "exec", Image: e.image, Args: []string{"forever"}, ReadinessProbe: fastProbe(execProbe("/app/prog", "absent:"+flag))},
		{Name: "http", Image: e.image, Args: []string{"http:" + strconv.Itoa(httpPort) + ":" + flag, "forever"}, ReadinessProbe: fastProbe(httpProbe(httpPort, "/healthz"))},
		{Name: "tcp", Image: e.image, Args: []string{"tcp:" + strconv.Itoa(tcpPort) + ":" + flag, "forever"}, ReadinessProbe: fastProbe(tcpProbe(tcpPort))},
		{Name: "grpc", Image: e.image, Args: []string{"forever"}, ReadinessProbe: fastProbe(grpcProbe(grpcPort))},
	}
	e.create(spec)
	allReady := func(want bool) func(*runtimev1.PodStatus) bool {
		return func(st *runtimev1.PodStatus) bool {
			for _, cs := range st.GetContainerStatuses() {
				if cs.GetReady() != want || cs.GetState().GetRunning() == nil || !cs.GetStarted() {
					return false
				}
			}
			return st.GetContainersReady() == want
		}
	}
	e.waitFor(spec.Uid, "every container ready", 30*time.Second, allReady(true))

	os.WriteFile(flag, []byte("x"), 0o644)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	st := e.waitFor(spec.Uid, "every container not ready", 30*time.Second, allReady(false))
	if st.GetPhase() != runtimev1.PodPhase_POD_PHASE_RUNNING {
		t.Errorf("phase %v", st.GetPhase())
	}
	for _, cs := range st.GetContainerStatuses() {
		if cs.GetRestartCount() != 0 {
			t.Errorf("%s: a failing readiness probe must not restart (restartCount %d)", cs.GetName(), cs.GetRestartCount())
		}
	}
	for _, want := range []string{
		"Readiness probe failed: " + flag + " exists",
		"Readiness probe failed: HTTP probe failed with statuscode: 500",
		fmt.Sprintf("Readiness probe failed: dial tcp 127.0.0.1:%d: connect: connection refused", tcpPort),
		`Readiness probe failed: service unhealthy (responded with "NOT_SERVING")`,
	} {
		ev := w.waitFor(t, spec.Uid, "Unhealthy", want)
		if ev.GetType() != runtimev1.EventType_EVENT_TYPE_WARNING {
			t.Errorf("Unhealthy event type %v", ev.GetType())
		}
	}

	// The tcp container stopped listening for good; the others recover.
	os.Remove(flag)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	e.waitFor(spec.Uid, "exec, http and grpc ready again", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return statusOf(st, "exec").GetReady() && statusOf(st, "http").GetReady() && statusOf(st, "grpc").GetReady() &&
			!statusOf(st, "tcp").GetReady() && !st.GetContainersReady()
	})
}

// A liveness failure kills the container with the kubelet's message and
// restarts it; Unhealthy events carry the probe's output.
func TestIntegrationLivenessRestarts(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	flag := filepath.Join(t.TempDir(), "sick")
	port := freePort(t)
	spec := e.podSpec("live", "http:"+strconv.Itoa(port)+":"+flag, "trap:0", "forever")
	lp := httpProbe(port, "/")
	// The delay lets the server listen before the first probe.
	lp.PeriodSeconds, lp.FailureThreshold, lp.InitialDelaySeconds = 1, 2, 1
	spec.Containers[0].LivenessProbe = lp
	e.create(spec)
	e.waitFor(spec.Uid, "ready", 20*time.Second, func(st *runtimev1.PodStatus) bool { return ctrState(st).GetReady() })
	time.Sleep(2500 * time.Millisecond) // passing probes change nothing
	if n := len(w.find(spec.Uid, "Unhealthy")); n != 0 || ctrState(e.status(spec.Uid)).GetRestartCount() != 0 {
		t.Fatalf("a healthy container: %d Unhealthy events, status %s", n, prettyStatus(e.status(spec.Uid)))
	}
	os.WriteFile(flag, []byte("x"), 0o644)
	ev := w.waitFor(t, spec.Uid, "Killing", "Container main failed liveness probe, will be restarted")
	w.waitFor(t, spec.Uid, "Unhealthy", "Liveness probe failed: HTTP probe failed with statuscode: 500")
	if n := len(w.find(spec.Uid, "Unhealthy")); n < 2 {
		t.Errorf("failureThreshold 2 but %d Unhealthy events before the kill", n)
	}
	if ev.GetContainer() != "main" {
		t.Errorf("Killing event container %q", ev.GetContainer())
	}
	os.Remove(flag)
	st := e.waitFor(spec.Uid, "restarted and running", 20*time.Second, func(st *runtimev1.PodStatus) bool {
		return ctrState(st).GetRestartCount() >= 1 && ctrState(st).GetState().GetRunning() != nil
	})
	lt := ctrState(st).GetLastTerminationState().GetTerminated()
	if lt == nil {
		t.Fatalf("no last termination state: %s", prettyStatus(st))
	}
	// trap:0 exits 0 on the SIGTERM of the graceful stop.
	if lt.GetExitCode() != 0 {
		t.Errorf("last termination %v, want the graceful exit", lt)
	}
	e.waitFor(spec.Uid, "ready after restart", 20*time.Second, func(st *runtimev1.PodStatus) bool { return ctrState(st).GetReady() })
}

// Liveness with restartPolicy Never: the container is killed and stays
// terminated; the message does not promise a restart.
func TestIntegrationLivenessNeverRestart(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	spec := e.podSpec("live-never", "forever")
	spec.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	spec.Containers[0].LivenessProbe = fastProbe(execProbe("/app/prog", "exit:3"))
	e.create(spec)
	st := e.waitFor(spec.Uid, "failed", 20*time.Second, func(st *runtimev1.PodStatus) bool {
		return st.GetPhase() == runtimev1.PodPhase_POD_PHASE_FAILED
	})
	if ctrState(st).GetRestartCount() != 0 {
		t.Errorf("restartCount %d", ctrState(st).GetRestartCount())
	}
	ev := w.waitFor(t, spec.Uid, "Killing", "failed liveness probe")
	if ev.GetMessage() != "Container main failed liveness probe" {
		t.Errorf("Killing message %q", ev.GetMessage())
	}
	w.waitFor(t, spec.Uid, "Unhealthy", `Liveness probe failed: command "/app/prog exit:3" exited with 3`)
}

// The startup probe gates the others: until it passes the container is
// neither started nor ready and the (failing) liveness probe does not run;
// a startup probe that keeps failing restarts the container.
func TestIntegrationStartupProbe(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	flag := filepath.Join(t.TempDir(), "starting")
	os.WriteFile(flag, []byte("x"), 0o644)
	spec := e.podSpec("startup", "forever")
	sp := fastProbe(execProbe("/app/prog", "absent:"+flag))
	sp.FailureThreshold = 60
	spec.Containers[0].StartupProbe = sp
	lp := fastProbe(execProbe("/app/prog", "absent:"+flag))
	lp.InitialDelaySeconds = 1
	spec.Containers[0].LivenessProbe = lp
	e.create(spec)
	e.waitFor(spec.Uid, "running", 20*time.Second, running)
	time.Sleep(2500 * time.Millisecond)
	st := e.status(spec.Uid)
	if cs := ctrState(st); cs.GetStarted() || cs.GetReady() || st.GetContainersReady() {
		t.Fatalf("started/ready before the startup probe passed: %s", prettyStatus(st))
	}
	for _, ev := range w.find(spec.Uid, "Unhealthy") {
		if strings.HasPrefix(ev.GetMessage(), "Liveness") {
			t.Fatalf("liveness ran before startup passed: %s", ev.GetMessage())
		}
	}
	w.waitFor(t, spec.Uid, "Unhealthy", "Startup probe failed: "+flag+" exists")
	os.Remove(flag)
	e.waitFor(spec.Uid, "started and ready", 20*time.Second, func(st *runtimev1.PodStatus) bool {
		return ctrState(st).GetStarted() && ctrState(st).GetReady() && st.GetContainersReady()
	})

	spec2 := e.podSpec("startup-fails", "forever")
	sp2 := fastProbe(tcpProbe(freePort(t)))
	sp2.FailureThreshold = 2
	spec2.Containers[0].StartupProbe = sp2
	e.create(spec2)
	w.waitFor(t, spec2.Uid, "Killing", "Container main failed startup probe, will be restarted")
	e.waitFor(spec2.Uid, "restarted", 20*time.Second, func(st *runtimev1.PodStatus) bool { return ctrState(st).GetRestartCount() >= 1 })
}

// recorder is an HTTP server on 127.0.0.1 that appends each request's path
// to a file (the hook's side of an ordering check).
func recorder(t *testing.T, path string) int {
	t.Helper()
	var mu sync.Mutex
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		f, _ := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		fmt.Fprintln(f, "http"+r.URL.Path)
		f.Close()
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// postStart runs after start and the container is Running only once it
// finished; preStop (exec, httpGet and sleep) runs before SIGTERM.
func TestIntegrationLifecycleHooks(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	dir := t.TempDir()
	order := filepath.Join(dir, "order")
	port := recorder(t, order)
	spec := e.podSpec("hooks", "onterm:"+order+":sigterm", "forever")
	spec.Containers[0].Lifecycle = &runtimev1.Lifecycle{
		PostStart: &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_Exec{Exec: &runtimev1.ExecAction{
			Command: []string{"/app/prog", "sleep:1500ms", "append:" + order + ":poststart"}}}},
		PreStop: &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_Exec{Exec: &runtimev1.ExecAction{
			Command: []string{"/app/prog", "append:" + order + ":prestop"}}}},
	}
	spec.Containers = append(spec.Containers, &runtimev1.ContainerSpec{Name: "web", Image: e.image, Args: []string{"forever"},
		Lifecycle: &runtimev1.Lifecycle{PreStop: &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_HttpGet{
			HttpGet: &runtimev1.HTTPGetAction{Port: int32(port), Path: "/prestop"}}}}})
	grace := int64(10)
	spec.TerminationGracePeriodSeconds = &grace
	e.create(spec)
	w.waitFor(t, spec.Uid, "Started", "Started container main")
	st := e.status(spec.Uid)
	if cs := statusOf(st, "main"); cs.GetState().GetRunning() != nil || cs.GetStarted() {
		t.Errorf("running before postStart finished: %s", prettyStatus(st))
	}
	st = e.waitFor(spec.Uid, "running", 20*time.Second, func(st *runtimev1.PodStatus) bool {
		return statusOf(st, "main").GetState().GetRunning() != nil
	})
	if got := readLines(order); len(got) != 1 || got[0] != "poststart" {
		t.Errorf("when Running, the postStart hook has finished: file %v", got)
	}
	if !statusOf(st, "main").GetReady() {
		t.Errorf("without readiness probe, ready once running: %s", prettyStatus(st))
	}
	if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: spec.Uid, Wait: true}); err != nil {
		t.Fatal(err)
	}
	got := readLines(order)
	idx := map[string]int{}
	for i, l := range got {
		idx[l] = i + 1
	}
	if idx["prestop"] == 0 || idx["sigterm"] == 0 || idx["prestop"] > idx["sigterm"] || idx["http/prestop"] == 0 {
		t.Errorf("want poststart, prestop (exec) before sigterm, and the httpGet preStop: got %v", got)
	}

	// preStop sleep counts against the grace period and delays SIGTERM.
	order2 := filepath.Join(dir, "order2")
	spec2 := e.podSpec("sleepy", "onterm:"+order2+":sigterm", "forever")
	spec2.Containers[0].Lifecycle = &runtimev1.Lifecycle{PreStop: &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_SleepSeconds{SleepSeconds: 2}}}
	e.create(spec2)
	e.waitFor(spec2.Uid, "running", 20*time.Second, running)
	t0 := time.Now()
	if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: spec2.Uid, Wait: true}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 2*time.Second || d > 8*time.Second {
		t.Errorf("delete with a 2 s preStop sleep took %s", d)
	}
	if got := readLines(order2); len(got) != 1 || got[0] != "sigterm" {
		t.Errorf("SIGTERM after the sleep: %v", got)
	}
}

// A failing postStart kills the container (FailedPostStartHook) and the
// restart policy applies; a failing preStop is reported and SIGTERM still
// follows.
func TestIntegrationFailedHooks(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	spec := e.podSpec("badpoststart", "forever")
	spec.Containers[0].Lifecycle = &runtimev1.Lifecycle{PostStart: &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_Exec{
		Exec: &runtimev1.ExecAction{Command: []string{"/app/prog", "echo:nope", "exit:7"}}}}}
	e.create(spec)
	ev := w.waitFor(t, spec.Uid, "FailedPostStartHook", "exited with 7")
	if ev.GetType() != runtimev1.EventType_EVENT_TYPE_WARNING || !strings.Contains(ev.GetMessage(), "Exec lifecycle hook ([/app/prog echo:nope exit:7]) for Container \"main\"") {
		t.Errorf("event %v", ev)
	}
	st := e.waitFor(spec.Uid, "restarted", 20*time.Second, func(st *runtimev1.PodStatus) bool { return ctrState(st).GetRestartCount() >= 1 })
	if ctrState(st).GetState().GetRunning() != nil {
		t.Errorf("a container whose postStart fails never runs: %s", prettyStatus(st))
	}

	order := filepath.Join(t.TempDir(), "order")
	spec2 := e.podSpec("badprestop", "onterm:"+order+":sigterm", "append:"+order+":up", "forever")
	spec2.Containers[0].Lifecycle = &runtimev1.Lifecycle{PreStop: &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_HttpGet{
		HttpGet: &runtimev1.HTTPGetAction{Port: int32(freePort(t)), Path: "/stop"}}}}
	e.create(spec2)
	e.waitFor(spec2.Uid, "running", 20*time.Second, running)
	waitFile(t, order, "up") // the SIGTERM handler is in place
	if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: spec2.Uid, Wait: true}); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, spec2.Uid, "FailedPreStopHook", "HTTP lifecycle hook (/stop) for Container \"main\"")
	if got := readLines(order); len(got) != 2 || got[1] != "sigterm" {
		t.Errorf("SIGTERM after a failed preStop: %v", got)
	}
}

// A native sidecar starts (startup probe passed) before the next init
// container and the main container, does not block Initialized, is
// restarted when it exits, and stops after the main container.
func TestIntegrationNativeSidecar(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	dir := t.TempDir()
	order := filepath.Join(dir, "order")
	port := freePort(t)
	once := filepath.Join(dir, "once")
	sp := fastProbe(tcpProbe(port))
	sp.FailureThreshold = 30
	spec := e.podSpec("sidecar")
	spec.InitContainers = []*runtimev1.ContainerSpec{
		{Name: "side", Image: e.image, RestartPolicy: runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS,
			Args:         []string{"onterm:" + order + ":side-term", "sleep:1s", "append:" + order + ":side-up", "tcp:" + strconv.Itoa(port), "forever"},
			StartupProbe: sp},
		{Name: "init", Image: e.image, Args: []string{"append:" + order + ":init"}},
	}
	spec.Containers[0].Args = []string{"onterm:" + order + ":main-term", "append:" + order + ":main", "forever"}
	// A second sidecar that exits once: it is restarted.
	spec.InitContainers = append(spec.InitContainers, &runtimev1.ContainerSpec{Name: "flaky", Image: e.image,
		RestartPolicy: runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS, Args: []string{"failonce:" + once, "forever"}})
	e.create(spec)
	st := e.waitFor(spec.Uid, "running, initialized, ready", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return running(st) && st.GetInitialized() && st.GetContainersReady()
	})
	if cs := statusOf(st, "side"); cs.GetState().GetRunning() == nil || !cs.GetStarted() || !cs.GetReady() {
		t.Errorf("sidecar status %v", cs)
	}
	if cs := statusOf(st, "init"); cs.GetState().GetTerminated().GetReason() != "Completed" {
		t.Errorf("init status %v", cs)
	}
	e.waitFor(spec.Uid, "flaky sidecar restarted", 20*time.Second, func(st *runtimev1.PodStatus) bool {
		cs := statusOf(st, "flaky")
		return cs.GetRestartCount() >= 1 && cs.GetState().GetRunning() != nil
	})
	waitFile(t, order, "main")
	if got := readLines(order); strings.Join(got, " ") != "side-up init main" {
		t.Errorf("start order %v, want side-up init main", got)
	}
	if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: spec.Uid, Wait: true}); err != nil {
		t.Fatal(err)
	}
	if got := readLines(order); strings.Join(got, " ") != "side-up init main main-term side-term" {
		t.Errorf("order %v, want the sidecar to stop after main", got)
	}
	starts := w.find(spec.Uid, "Started")
	var names []string
	for _, ev := range starts {
		names = append(names, ev.GetContainer())
	}
	if len(names) < 3 || names[0] != "side" || names[1] != "init" {
		t.Errorf("Started events in order %v", names)
	}
}

// A job's sidecar does not keep the pod alive: once the main container
// completed, the sidecar is stopped and the pod Succeeded.
func TestIntegrationSidecarJobCompletes(t *testing.T) {
	e := newEnv(t)
	order := filepath.Join(t.TempDir(), "order")
	spec := e.podSpec("job", "sleep:300ms", "append:"+order+":main-done", "exit:0")
	spec.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	spec.InitContainers = []*runtimev1.ContainerSpec{{Name: "side", Image: e.image,
		RestartPolicy: runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS,
		Args:          []string{"onterm:" + order + ":side-term", "forever"}}}
	e.create(spec)
	st := e.waitFor(spec.Uid, "Succeeded", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return st.GetPhase() == runtimev1.PodPhase_POD_PHASE_SUCCEEDED && statusOf(st, "side").GetState().GetTerminated() != nil
	})
	if got := strings.Join(readLines(order), " "); got != "main-done side-term" {
		t.Errorf("order %q", got)
	}
	if !st.GetInitialized() {
		t.Errorf("a pod whose main container ran stays Initialized: %s", prettyStatus(st))
	}
}

// After kill -9 of the daemon, the next one re-attaches without restarting
// and probes again: readiness comes back, liveness still restarts, and a
// native sidecar is adopted in place.
func TestIntegrationProbesAfterDaemonKill9(t *testing.T) {
	e := newSubprocessEnv(t)
	dir := e.dir
	d1 := e.startSubprocess()
	t.Cleanup(func() { os.RemoveAll(dir) })

	flag := filepath.Join(t.TempDir(), "sick")
	port := freePort(t)
	spec := e.podSpec("probed", "http:"+strconv.Itoa(port)+":"+flag, "forever")
	spec.Containers[0].ReadinessProbe = fastProbe(httpProbe(port, "/"))
	lp := fastProbe(httpProbe(port, "/"))
	lp.FailureThreshold, lp.InitialDelaySeconds = 2, 1
	spec.Containers[0].LivenessProbe = lp
	spec.InitContainers = []*runtimev1.ContainerSpec{{Name: "side", Image: e.image, Args: []string{"forever"},
		RestartPolicy: runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS}}
	e.create(spec)
	before := e.waitFor(spec.Uid, "ready", 30*time.Second, func(st *runtimev1.PodStatus) bool { return st.GetContainersReady() })

	d1.Process.Signal(syscall.SIGKILL)
	e.c.Close()
	d2 := e.startSubprocess()
	defer func() {
		e.deleteAll()
		d2.Process.Signal(syscall.SIGTERM)
	}()
	w := e.watch()
	after := e.waitFor(spec.Uid, "ready after re-attach", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return st.GetContainersReady() && st.GetInitialized()
	})
	for _, n := range []string{"side", "main"} {
		if statusOf(after, n).GetContainerId() != statusOf(before, n).GetContainerId() || statusOf(after, n).GetRestartCount() != 0 {
			t.Errorf("%s restarted by the re-attach:\n%s", n, prettyStatus(after))
		}
	}
	os.WriteFile(flag, []byte("x"), 0o644)
	w.waitFor(t, spec.Uid, "Killing", "Container main failed liveness probe, will be restarted")
	os.Remove(flag)
	e.waitFor(spec.Uid, "restarted and ready", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return statusOf(st, "main").GetRestartCount() == 1 && st.GetContainersReady()
	})
}
