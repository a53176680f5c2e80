package daemon

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/doctor"
	"github.com/k3sm-dev/k3sm/internal/server/status"
)

// remountSysEnv: the subprocess daemon remounts /sys first (remountSys).
const remountSysEnv = "K3SM_RUNTIME_TEST_REMOUNT_SYS"

// ownMountNamespace starts the subprocess daemon in a mount namespace of
// its own (Go makes / private in it before exec).
func ownMountNamespace() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
}

// remountSys is what `ip netns exec` does to the namespace it runs a
// command in: a fresh sysfs over /sys, so nothing is mounted under
// /sys/fs/cgroup.
func remountSys() error {
	if err := syscall.Unmount("/sys", syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("umount /sys: %w", err)
	}
	if err := syscall.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		return fmt.Errorf("mount sysfs on /sys: %w", err)
	}
	return nil
}

// The runtime started as under `ip netns exec`, where it sees no cgroup
// hierarchy and a 100m pod was seen using 391m: GetRuntimeInfo says no
// cgroups and why, a pod with a CPU limit gets a LimitNotEnforced Warning
// event naming the limit, and doctor, which sees this machine's cgroups
// itself, asks the runtime and FAILs with the fix; status shows runtimed
// impaired.
func TestIntegrationNoCgroupsReported(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a mount namespace of its own needs root")
	}
	e := newSubprocessEnv(t)
	dir := e.dir
	e.remountSys = true
	d := e.startSubprocess()
	t.Cleanup(func() {
		e.deleteAll()
		d.Process.Signal(syscall.SIGTERM)
		<-e.daemonExited
		os.RemoveAll(dir)
	})

	info, err := e.c.Runtime.GetRuntimeInfo(context.Background(), &runtimev1.GetRuntimeInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rl := info.GetResourceLimits()
	if rl.GetCgroupMode() != "none" || len(rl.GetEnforced()) != 0 || rl.GetCause() != cgroups.CauseNotMounted ||
		!strings.Contains(rl.GetReason(), "/sys/fs/cgroup is empty") || !strings.Contains(rl.GetFix(), "ip netns exec") {
		t.Errorf("GetRuntimeInfo resource_limits: %v", rl)
	}

	w := e.watch()
	spec := e.podSpec("limited", "echo:start", "forever")
	spec.Containers[0].Resources = &runtimev1.Resources{CpuLimitMillis: 100, CpuRequestMillis: 100, MemoryLimitBytes: 64 << 20}
	e.create(spec)
	ev := w.waitFor(t, spec.GetUid(), "LimitNotEnforced", "CPU limit 100m is not enforced")
	if ev.GetType() != runtimev1.EventType_EVENT_TYPE_WARNING || ev.GetContainer() != "main" ||
		!strings.Contains(ev.GetMessage(), "memory limit 64Mi") || !strings.Contains(ev.GetMessage(), "no cgroup hierarchy is mounted") {
		t.Errorf("event: %v", ev)
	}
	t.Logf("%s: %s", ev.GetReason(), ev.GetMessage())
	e.waitFor(spec.GetUid(), "Running", 30*time.Second, running)
	// Once per container, not per attempt or status change.
	time.Sleep(500 * time.Millisecond)
	if n := len(w.find(spec.GetUid(), "LimitNotEnforced")); n != 1 {
		t.Errorf("%d LimitNotEnforced events, want 1", n)
	}

	r := doctor.Run(doctor.Options{DataDir: dir, Ports: []doctor.Port{}})
	i := slices.IndexFunc(r.Checks, func(c doctor.Check) bool { return c.Name == "cgroups" })
	if i < 0 {
		t.Fatalf("no cgroups check: %+v", r.Checks)
	}
	c := r.Checks[i]
	if c.Status != doctor.Fail || r.Result != doctor.Fail || !strings.Contains(c.Detail, "the running runtime reports no cgroups") ||
		!strings.Contains(c.Detail, "CPU and memory limits are not enforced") || !strings.Contains(c.Fix, "ip netns exec") {
		t.Errorf("doctor: %+v (result %s), want FAIL from the runtime's report with the fix", c, r.Result)
	}
	t.Logf("doctor: %s %s; fix: %s", c.Status, c.Detail, c.Fix)

	// status, as for a server whose runtimed this is: impaired, degraded.
	release, err := controlplane.LockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	l := datadir.New(dir)
	atomicfile.WriteFile(l.ServerInfoFile(), []byte(`{"pid":1,"apiURL":"https://127.0.0.1:1","nodeName":"n"}`), 0o600)
	atomicfile.WriteFile(l.ComponentsFile(), fmt.Appendf(nil, `{"pid":1,"children":[{"name":"runtimed","pid":%d}]}`, d.Process.Pid), 0o600)
	sr, err := status.Check(context.Background(), dir, status.Options{Units: []string{}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	i = slices.IndexFunc(sr.Components, func(c status.Component) bool { return c.Name == "runtimed" })
	if i < 0 || sr.Components[i].Health != status.Impaired || !strings.Contains(sr.Components[i].Detail, "CPU and memory limits are not enforced") ||
		!strings.Contains(sr.Components[i].Detail, "ip netns exec") || sr.State != status.Degraded || !strings.Contains(sr.Hint, "impaired: [runtimed]") {
		t.Errorf("status: %+v", sr)
	}
}
