package daemon

import (
	"context"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// A pod whose pod.json cannot be read after a daemon restart leaves
// nothing running unmanaged: its container (and what it forked) is
// killed, its state file and logs are quarantined, the directory goes,
// and a PodStateUnreadable event says so.
func TestIntegrationUnreadablePodStateKillsContainers(t *testing.T) {
	e := newEnv(t)
	tmp := t.TempDir()
	spec := e.podSpec("corrupt", "pid:"+filepath.Join(tmp, "main.pid"), "forever")
	spec.Containers = append(spec.Containers, &runtimev1.ContainerSpec{Name: "forker", Image: "native",
		Command: []string{"/bin/sh", "-c", "sleep 1000 & echo $! " + imagetest.PidNSSuffix + " > " + filepath.Join(tmp, "child.pid") + "; wait"}})
	e.create(spec)
	e.waitFor(spec.Uid, "Running", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return running(st) && st.GetContainerStatuses()[1].GetState().GetRunning() != nil
	})
	pids := []int{readPid(t, filepath.Join(tmp, "main.pid")), readPid(t, filepath.Join(tmp, "child.pid"))}
	e.stop() // detaches: the pod keeps running

	stateFile := filepath.Join(e.dir, "pods", spec.Uid, "pod.json")
	if err := os.WriteFile(stateFile, []byte(`{"spec": {"uid": trunc`), 0o600); err != nil {
		t.Fatal(err)
	}
	e.startInProcess()
	w := e.watch()
	ev := w.waitFor(t, spec.Uid, "PodStateUnreadable", "killed its 2 running container(s)")
	if ev.GetType() != runtimev1.EventType_EVENT_TYPE_WARNING || ev.GetNamespace() != "default" || ev.GetName() != "corrupt" {
		t.Errorf("event %v", ev)
	}
	for _, pid := range pids {
		waitGone(t, "process of the pod whose state is unreadable", pid)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "pods", spec.Uid)); !os.IsNotExist(err) {
		t.Errorf("pod directory still there: %v", err)
	}
	q, _ := filepath.Glob(filepath.Join(e.dir, "quarantine", spec.Uid+"-*", "pod.json"))
	if len(q) != 1 {
		t.Errorf("quarantined state file: %v", q)
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), e.dir+"/") && strings.Contains(string(b), "k3sm-shim") {
			t.Errorf("shim still running: pid %s %q", p.Name(), b)
		}
	}
	if r, _ := e.c.Runtime.ListPods(context.Background(), &runtimev1.ListPodsRequest{}); len(r.GetPods()) != 0 {
		t.Errorf("%d pods listed", len(r.GetPods()))
	}
}
