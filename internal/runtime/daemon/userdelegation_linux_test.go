package daemon

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
)

// The rootless runtime on cgroup v2 under systemd user delegation
// (`systemd-run --user -p Delegate=yes`, or the user unit): the daemon,
// not root, takes the subtree systemd handed the user and the kernel
// enforces its pods' limits there, as rootless podman and k3s rootless do.
// Run by test/vm as an unprivileged user; elsewhere it skips.
func TestIntegrationRootlessUserDelegation(t *testing.T) {
	integration(t)
	if os.Geteuid() == 0 {
		t.Skip("runs as an unprivileged user in a delegated cgroup v2 subtree (test/vm runs it so)")
	}
	opts := cgroups.Options{Name: fmt.Sprintf("k3sm-daemon-test-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)}
	if s := cgroups.Detect(opts); s.Version != cgroups.V2 || len(s.Enforced) < 3 {
		t.Skipf("no delegated cgroup v2 subtree with memory, cpu and pids for uid %d: %s", os.Geteuid(), s.Describe())
	}
	t.Cleanup(func() {
		if err := cgroups.New(opts).Remove(); err != nil {
			t.Errorf("remove the test's cgroup subtree: %v", err)
		}
	})
	e := newEnvWith(t, func(cfg *Config) { cfg.Cgroups = opts })
	info, err := e.c.Runtime.GetRuntimeInfo(context.Background(), &runtimev1.GetRuntimeInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if rl := info.GetResourceLimits(); rl.GetCgroupMode() != "v2" || len(rl.GetEnforced()) != 3 {
		t.Fatalf("the rootless daemon's limits: %v", rl)
	}
	spec := e.oomPod()
	e.create(spec)
	cs := e.waitOOMRestarted(spec.GetUid(), 60*time.Second)
	t.Logf("rootless, uid %d: OOMKilled by the kernel and restarted: %v", os.Geteuid(), cs.GetLastTerminationState().GetTerminated())
	// Its cgroups are below the user's delegated subtree, not the sampler's.
	m := cgroups.New(opts)
	for _, d := range m.PodDirs(spec.GetUid()) {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("pod cgroup: %v", err)
		}
	}
	t.Logf("%s", m.Describe())
}

// Unprivileged and not delegated (a login shell's scope, owned by root):
// no cgroups, and the daemon says why and how to get them, rather than
// reporting the sampler's approximation as enforced limits.
func TestIntegrationRootlessUndelegatedSaysHow(t *testing.T) {
	integration(t)
	if os.Geteuid() == 0 {
		t.Skip("runs as an unprivileged user outside any delegated cgroup (test/vm runs it so)")
	}
	opts := cgroups.Options{Name: fmt.Sprintf("k3sm-daemon-test-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)}
	if s := cgroups.Detect(opts); s.Version != cgroups.None || s.Cause != cgroups.CauseNotPermitted {
		t.Skipf("uid %d is not in an undelegated cgroup here: %s", os.Geteuid(), s.Describe())
	}
	e := newEnvWith(t, func(cfg *Config) { cfg.Cgroups = opts })
	info, err := e.c.Runtime.GetRuntimeInfo(context.Background(), &runtimev1.GetRuntimeInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rl := info.GetResourceLimits()
	if rl.GetCgroupMode() != "none" || len(rl.GetEnforced()) != 0 || rl.GetCause() != cgroups.CauseNotPermitted ||
		!strings.Contains(rl.GetFix(), "Delegate=yes") {
		t.Fatalf("undelegated rootless daemon reports %v", rl)
	}
	t.Logf("reported: %s; fix: %s", rl.GetReason(), rl.GetFix())
}
