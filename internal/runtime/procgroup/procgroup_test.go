package procgroup

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

func readPid(t *testing.T, path string) int {
	t.Helper()
	var pid int
	poll.Until(t, 5*time.Second, "a pid in "+path, func() bool {
		b, err := os.ReadFile(path)
		p, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		pid = p
		return err == nil && perr == nil
	})
	return pid
}

// gone waits up to 2 s for pid to end (a zombie counts). Not poll: its
// caller reports a survivor (Errorf), kills it and goes on.
func gone(pid int) bool {
	for i := 0; i < 100; i++ {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i+1:]), " Z") {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// Wait kills what the leader left in its group (and session) and from then
// on Signal sends nothing.
func TestWaitKillsTheRestAndSignalStops(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("uses /proc")
	}
	for _, session := range []bool{false, true} {
		pidFile := filepath.Join(t.TempDir(), "pid")
		// With a session, the background job is put in a group of its
		// own (as an interactive shell's job control does).
		script := "sleep 100 & echo $! > " + pidFile
		if session {
			script = "set -m; sleep 100 & echo $! > " + pidFile
		}
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: !session, Setsid: session}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		g := New(cmd.Process.Pid, session)
		if err := g.Wait(nil, cmd.Wait); err != nil {
			t.Fatal(err)
		}
		child := readPid(t, pidFile)
		if !gone(child) {
			syscall.Kill(child, syscall.SIGKILL)
			t.Errorf("session=%v: the leader's background child %d survived it", session, child)
		}
		if err := g.Signal(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("Signal after Wait: %v, want %v", err, os.ErrProcessDone)
		}
	}
}

// KillOrphanGroup signals nothing when the start time does not match.
func TestKillOrphanGroupChecksIdentity(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("uses /proc")
	}
	cmd := exec.Command("/bin/sleep", "100")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	ticks := StartTicks(cmd.Process.Pid)
	if ticks == 0 {
		t.Fatal("no start time")
	}
	if err := KillOrphanGroup(cmd.Process.Pid, ticks+1); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("wrong identity: %v", err)
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("a process that is not the recorded one was signalled: %v", err)
	}
	if err := KillOrphanGroup(cmd.Process.Pid, ticks); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("the recorded process was not killed")
	}
}
