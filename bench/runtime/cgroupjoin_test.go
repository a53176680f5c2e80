package runtimebench

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
)

// TestCgroupJoinCost measures what placing a new process in a container's
// cgroups costs, as the sandbox does for every container's init: the
// write of its pid to cgroup.procs of the first hierarchy, then of the
// next one at once. On cgroup v1 the first waits for an RCU grace period
// (the kernel's threadgroup lock switching to its writer mode); the
// writes right after it do not. The cgroup2 option favordynmods, which a
// root runtime daemon sets (cgroups.FavorDynamicChanges), removes the
// wait; the log says which mode was in force.
//
//	K3SM_BENCH_RUNTIME=1 go test -count=1 -v -run TestCgroupJoinCost ./bench/runtime/
func TestCgroupJoinCost(t *testing.T) {
	if os.Getenv("K3SM_BENCH_RUNTIME") == "" {
		t.Skip("set K3SM_BENCH_RUNTIME=1 to run")
	}
	if os.Geteuid() != 0 {
		t.Skip("making cgroups needs root")
	}
	// The hierarchies the runtime uses on this host: cgroup v2's one, or
	// v1's cpu and memory.
	roots := []string{"/sys/fs/cgroup"}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); errors.Is(err, os.ErrNotExist) {
		roots = []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory"}
	}
	var dirs []string
	for _, r := range roots {
		d := filepath.Join(r, "k3sm-bench-join")
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			t.Skipf("no cgroup to make under %s: %v", r, err)
		}
		t.Cleanup(func() { os.Remove(d) })
		dirs = append(dirs, d)
	}
	const n = 21
	first, next := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for range n {
		cmd := exec.Command("sleep", "0.1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid := []byte(strconv.Itoa(cmd.Process.Pid))
		for i, d := range dirs {
			start := time.Now()
			if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), pid, 0); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				first = append(first, time.Since(start))
			} else if i == 1 {
				next = append(next, time.Since(start))
			}
		}
		cmd.Wait()
		time.Sleep(200 * time.Millisecond) // an idle node between pod starts
	}
	med := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	mode, _ := cgroups.ReadAttachMode("/proc/self/mountinfo")
	t.Logf("hierarchies: %v; %s", roots, mode.Describe())
	t.Logf("join, first hierarchy: median %v, min %v, max %v (%d processes)", med(first), first[0], first[len(first)-1], n)
	if len(next) > 0 {
		t.Logf("join, the next hierarchy right after: median %v, max %v", med(next), next[len(next)-1])
	}
}
