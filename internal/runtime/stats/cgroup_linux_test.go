//go:build linux

package stats

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// A container's cgroup counts what left its process group too (a
// daemonized child), which the process-group sampler cannot see.
func TestCgroupCountsEveryProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root here")
	}
	m := cgroups.New(cgroups.Options{Name: fmt.Sprintf("k3sm-stats-test-%d", os.Getpid())})
	if m.Version() == cgroups.None {
		// Only a mount namespace without cgroup hierarchies excuses root:
		// anything else is the detection failing on a host that has them.
		if m.Support().Cause == cgroups.CauseNotMounted {
			t.Skipf("no cgroup hierarchy in this test's mount namespace: %s", m.Describe())
		}
		t.Fatalf("root on a host with cgroup hierarchies, but no cgroups: %s", m.Describe())
	}
	t.Cleanup(func() { m.Remove() })
	if err := m.SetPod("u1", cgroups.Resources{}); err != nil {
		t.Fatal(err)
	}
	dirs, err := m.NewContainer("u1", "main", cgroups.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", "sleep 0.3; setsid sleep 100 & while :; do :; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	fallbacks := 0
	fallback := func() Sample {
		fallbacks++
		pg, _ := ProcessGroups([]int{cmd.Process.Pid})
		return pg[cmd.Process.Pid]
	}
	var s Sample
	poll.Every(t, context.Background(), 20*time.Second, 100*time.Millisecond, "both processes and 100 ms of CPU in the cgroup", func() error {
		var ok bool
		if s, ok = Cgroup(m, "u1", "main", fallback); !ok {
			t.Fatal("no reading from the container's cgroup")
		}
		if s.Processes < 2 || s.CPUNanos < 100e6 {
			return fmt.Errorf("sample %+v", s)
		}
		return nil
	})
	if s.Processes < 2 || s.CPUNanos < 100e6 || s.WorkingSetBytes == 0 {
		t.Fatalf("sample %+v: want the shell and its setsid child, >= 100ms CPU, some memory", s)
	}
	if u, err := m.ContainerUsage("u1", "main"); err == nil && u.HasMemory && u.HasCPU && fallbacks != 0 {
		t.Errorf("the process group was sampled %d times although the cgroups gave every reading", fallbacks)
	}
	pg, _ := ProcessGroups([]int{cmd.Process.Pid})
	if pg[cmd.Process.Pid].Processes >= s.Processes {
		t.Errorf("process group sees %d processes, cgroup %d: the setsid child should be outside the group", pg[cmd.Process.Pid].Processes, s.Processes)
	}
	if _, ok := Cgroup(nil, "u1", "main", func() Sample { return Sample{} }); ok {
		t.Error("Cgroup without a manager reported a reading")
	}
}
