//go:build linux

package sandbox

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/runtime/procgroup"
)

// A debug container joins its target only while the pid is the target's
// (its recorded start time), and only a target in a pid namespace of its
// own.
func TestOpenTargetChecksIdentity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the target is made in a new pid namespace")
	}
	start := func(flags uintptr) *exec.Cmd {
		t.Helper()
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	boxed := start(syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC)
	pid := boxed.Process.Pid
	ticks := procgroup.StartTicks(pid)
	if ticks == 0 {
		t.Fatalf("no start time for %d", pid)
	}

	tg, err := openTarget(&Join{Pid: pid, StartTicks: ticks})
	if err != nil {
		t.Fatalf("the target as recorded: %v", err)
	}
	if !tg.ownUser || !sameFile(tg.pid, "/proc/"+strconv.Itoa(pid)+"/ns/pid") || sameFile(tg.uts, "/proc/self/ns/uts") {
		t.Fatalf("namespaces opened: ownUser %v", tg.ownUser)
	}
	tg.Close()

	for name, j := range map[string]*Join{
		"another start time (the pid reused)": {Pid: pid, StartTicks: ticks + 1},
		"no start time recorded":              {Pid: pid},
	} {
		if _, err := openTarget(j); err == nil || !strings.Contains(err.Error(), "no longer running") {
			t.Errorf("%s: %v", name, err)
		}
	}

	plain := start(0).Process.Pid
	if _, err := openTarget(&Join{Pid: plain, StartTicks: procgroup.StartTicks(plain)}); err == nil ||
		!strings.Contains(err.Error(), "no pid namespace of its own") {
		t.Errorf("a target in the node's pid namespace: %v", err)
	}

	boxed.Process.Kill()
	boxed.Wait()
	if _, err := openTarget(&Join{Pid: pid, StartTicks: ticks}); err == nil || !strings.Contains(err.Error(), "no longer running") {
		t.Errorf("a target that exited: %v", err)
	}
}
