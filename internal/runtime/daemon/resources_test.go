package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
)

// newResourcesEnv is newEnv with the daemon's cgroups in a subtree of the
// test's own (removed at the end) or disabled.
func newResourcesEnv(t *testing.T, disable bool) (*env, cgroups.Options) {
	integration(t)
	opts := cgroups.Options{Name: fmt.Sprintf("k3sm-daemon-test-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6), Disable: disable}
	if !disable {
		if os.Geteuid() != 0 {
			t.Skip("creating cgroups needs root here")
		}
		// Root lacks a memory cgroup only in a mount namespace without
		// cgroup hierarchies; anywhere else that is the failure to see.
		if m := cgroups.New(opts); m.Support().Cause == cgroups.CauseNotMounted {
			t.Skipf("no cgroup hierarchy in this test's mount namespace: %s", m.Describe())
		} else if !m.Has(cgroups.Memory) {
			t.Fatalf("root on a host with cgroup hierarchies, but no memory cgroup: %s", m.Describe())
		}
	}
	if !disable {
		// Registered first, so it runs last: after the daemon stopped.
		t.Cleanup(func() {
			if err := cgroups.New(opts).Remove(); err != nil {
				t.Errorf("remove the test's cgroup subtree: %v", err)
			}
		})
	}
	e := newEnvWith(t, func(cfg *Config) {
		cfg.Cgroups = opts
		if testing.Verbose() { // the "resources:" line says what is in force
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
		}
	})
	return e, opts
}

// oomPod allocates 200 MB under a 32Mi limit, restartPolicy Always.
func (e *env) oomPod() *runtimev1.PodSpec {
	spec := e.podSpec("oom", "echo:start", "alloc:200Mi", "forever")
	spec.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_ALWAYS
	spec.Containers[0].Resources = &runtimev1.Resources{MemoryLimitBytes: 32 << 20, MemoryRequestBytes: 32 << 20}
	return spec
}

// waitOOMRestarted waits for the first attempt to be recorded OOMKilled
// (exit 137) in lastState, the container restarted.
func (e *env) waitOOMRestarted(uid string, timeout time.Duration) *runtimev1.ContainerStatus {
	st := e.waitFor(uid, "lastState OOMKilled after a restart", timeout, func(st *runtimev1.PodStatus) bool {
		cs := st.GetContainerStatuses()
		return len(cs) == 1 && cs[0].GetRestartCount() >= 1 && cs[0].GetLastTerminationState().GetTerminated().GetReason() == "OOMKilled"
	})
	cs := st.GetContainerStatuses()[0]
	if term := cs.GetLastTerminationState().GetTerminated(); term.GetExitCode() != 137 {
		e.t.Errorf("OOMKilled attempt exit code %d, want 137: %v", term.GetExitCode(), term)
	}
	return cs
}

func TestIntegrationOOMKilledByCgroup(t *testing.T) {
	e, opts := newResourcesEnv(t, false)
	spec := e.oomPod()
	e.create(spec)
	t0 := time.Now()
	cs := e.waitOOMRestarted(spec.GetUid(), 30*time.Second)
	t.Logf("OOMKilled and restarted %s after create: %v", time.Since(t0).Round(time.Millisecond), cs.GetLastTerminationState().GetTerminated())
	// The attempt's log shows it started, never that it got its 200 MB.
	if got, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.GetUid(), Previous: true}); got != "start\n" {
		t.Errorf("previous attempt's log %q", got)
	}
	m := cgroups.New(opts)
	dirs := m.PodDirs(spec.GetUid())
	// The restarted attempt may be OOM-killed and recreated meanwhile
	// (each attempt gets a fresh cgroup): its cgroups exist again soon.
	// Not poll: missing cgroups are reported (Errorf) and the test goes on
	// to check the delete.
	var missing []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		missing = nil
		for _, d := range m.ContainerDirs(spec.GetUid(), "main") {
			if _, err := os.Stat(d); err != nil {
				missing = append(missing, err.Error())
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, e := range missing {
		t.Errorf("container cgroup: %s", e)
	}
	zero := int64(0)
	if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: spec.GetUid(), GracePeriodSeconds: &zero, Wait: true}); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("pod cgroup %s still there after delete (%v)", d, err)
		}
	}
}

func TestIntegrationOOMKilledBySampler(t *testing.T) {
	e, _ := newResourcesEnv(t, true)
	spec := e.oomPod()
	e.create(spec)
	t0 := time.Now()
	cs := e.waitOOMRestarted(spec.GetUid(), 30*time.Second)
	t.Logf("without cgroups: OOMKilled by the sampler and restarted %s after create: %v", time.Since(t0).Round(time.Millisecond), cs.GetLastTerminationState().GetTerminated())
}

func TestIntegrationStatsFromCgroups(t *testing.T) {
	e, opts := newResourcesEnv(t, false)
	spec := e.podSpec("stats", "alloc:50Mi", "forever")
	spec.Containers = append(spec.Containers, &runtimev1.ContainerSpec{Name: "spin", Image: e.image, Args: []string{"spin:1h"},
		Resources: &runtimev1.Resources{CpuLimitMillis: 100, CpuRequestMillis: 100}})
	e.create(spec)
	e.waitFor(spec.GetUid(), "both running", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		cs := st.GetContainerStatuses()
		return len(cs) == 2 && cs[0].GetState().GetRunning() != nil && cs[1].GetState().GetRunning() != nil
	})
	// On cgroup v2 the kernel creates the workload in its cgroup
	// (CLONE_INTO_CGROUP); v1 has one directory per controller, and the
	// shim moves it there before it runs.
	v2 := cgroups.New(opts).Version() == cgroups.V2
	for _, c := range []string{"main", "spin"} {
		b, err := os.ReadFile(filepath.Join(e.dir, "pods", spec.GetUid(), "attempts", c, "0", "shim.json"))
		var st struct {
			BornInCgroup bool `json:"bornInCgroup"`
		}
		if err == nil {
			err = json.Unmarshal(b, &st)
		}
		if err != nil || st.BornInCgroup != v2 {
			t.Errorf("%s: shim.json %s (%v): bornInCgroup %v, want %v (cgroup v2: %v)", c, b, err, st.BornInCgroup, v2, v2)
		}
	}
	read := func() map[string]*runtimev1.ContainerStats {
		r, err := e.c.Runtime.ListPodStats(context.Background(), &runtimev1.ListPodStatsRequest{PodUid: spec.GetUid()})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*runtimev1.ContainerStats{}
		for _, c := range r.GetPods()[0].GetContainers() {
			out[c.GetName()] = c
		}
		return out
	}
	// Not poll: too little memory is reported (Errorf) and the test goes
	// on to measure the CPU limit.
	var s map[string]*runtimev1.ContainerStats
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if s = read(); s["main"].GetMemoryWorkingSetBytes() >= 50<<20 {
			break
		}
	}
	if ws := s["main"].GetMemoryWorkingSetBytes(); ws < 50<<20 || s["main"].GetProcessCount() != 1 {
		t.Errorf("main after allocating 50 MB: %v", s["main"])
	}
	t0, c0 := time.Now(), s["spin"].GetCpuUsageCoreNanoseconds()
	time.Sleep(3 * time.Second)
	c1 := read()["spin"].GetCpuUsageCoreNanoseconds()
	share := float64(c1-c0) / float64(time.Since(t0).Nanoseconds())
	t.Logf("spin under 100m: %.1f %% of a core (ListPodStats)", share*100)
	if share < 0.05 || share > 0.20 {
		t.Errorf("a busy loop under a 100m limit used %.1f %% of a core, want 5-20 %%", share*100)
	}
}
