package shimclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// The tests here need a process to get a chosen pid: they re-execute the
// test binary as pid 1 of a new pid namespace (root only), where nothing
// else forks and /proc/sys/kernel/ns_last_pid picks the next pid.
const pidnsChildEnv = "K3SM_SHIMCLIENT_TEST_PIDNS"

// inPidNamespace runs the calling test in a child process in a new pid
// namespace; it returns true in that child, where the test body runs.
func inPidNamespace(t *testing.T) bool {
	t.Helper()
	if os.Getenv(pidnsChildEnv) == "1" {
		// A /proc of this namespace, in a mount namespace of our own.
		if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("proc", "/proc", "proc", 0, ""); err != nil {
			t.Fatal(err)
		}
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: a new pid namespace and ns_last_pid")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), pidnsChildEnv+"=1", pidnsShimEnv+"="+shimBin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in a new pid namespace: %v\n%s", err, out)
	}
	t.Logf("in a new pid namespace:\n%s", out)
	return false
}

// decoy starts `sleep 60` as the leader of its own process group with pid
// want (free now), through ns_last_pid. Only this namespace forks, but the
// Go runtime may start a thread in between: retry.
func decoy(t *testing.T, want int) *exec.Cmd {
	t.Helper()
	for try := 0; try < 20; try++ {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(want-1)), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("/bin/sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == want {
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			return cmd
		}
		cmd.Process.Kill()
		cmd.Wait()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("could not start a process with pid %d", want)
	return nil
}

func alive(cmd *exec.Cmd) bool {
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(cmd.Process.Pid, &ws, syscall.WNOHANG, nil)
	return err == nil && pid == 0
}

// waitReaped waits until pid no longer exists (reaped by its parent).
func waitReaped(t *testing.T, pid int) {
	t.Helper()
	poll.Until(t, time.Second, fmt.Sprintf("process %d to be reaped", pid), func() bool {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	})
}

// Once the shim reaped the workload, a signal request must not reach a
// process that got its number (as a process group id) since: here a
// descendant that left the group holds the output, so the shim has reaped
// the workload but not yet recorded its exit for two seconds.
func TestSignalAfterReapSparesReusedPgid(t *testing.T) {
	if !inPidNamespace(t) {
		return
	}
	s, dir := newStarter(t)
	ctx := context.Background()
	p, err := s.Start(ctx, spec(dir, "reuse", "/bin/sh", "-c", "setsid sleep 3 & sleep 0.2; exit 0"))
	if err != nil {
		t.Fatal(err)
	}
	pid := p.Pid()
	waitReaped(t, pid)
	d := decoy(t, pid)
	err = p.Signal(syscall.SIGTERM)
	time.Sleep(100 * time.Millisecond)
	if !alive(d) {
		t.Fatalf("SIGTERM for the reaped workload %d killed the process group that reused its number (Signal returned %v)", pid, err)
	}
	if !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("Signal after the workload was reaped: %v, want %v", err, os.ErrProcessDone)
	}
	if es, err := p.Wait(ctx); err != nil || es.ExitCode != 0 {
		t.Errorf("exit %+v %v", es, err)
	}
}

// When the shim died and its workload exited meanwhile (reaped by pid 1),
// the daemon must not kill a process group that reused the workload's pid.
func TestOrphanKillSparesReusedPgid(t *testing.T) {
	if !inPidNamespace(t) {
		return
	}
	s, dir := newStarter(t)
	ctx := context.Background()
	p, err := s.Start(ctx, spec(dir, "orphan", "/bin/sleep", "0.5"))
	if err != nil {
		t.Fatal(err)
	}
	pid := p.Pid()
	shimPid := readShimPid(t, filepath.Join(dir, "state", "orphan"))
	if err := syscall.Kill(shimPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The workload is re-parented to this process (pid 1 here): reap it.
	poll.Until(t, 10*time.Second, "the orphaned workload to exit", func() bool {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, 0, nil)
		return got == pid && err == nil
	})
	d := decoy(t, pid)
	es, err := p.Wait(ctx)
	if err != nil || !es.Unknown {
		t.Errorf("Wait after the shim died: %+v %v, want an unknown status", es, err)
	}
	time.Sleep(100 * time.Millisecond)
	if !alive(d) {
		t.Fatalf("ending the dead shim's workload %d killed the process group that reused its number", pid)
	}
}

// A dead shim's workload that still runs is ended by Wait (it is provably
// the process the shim started).
func TestOrphanKillEndsLiveWorkload(t *testing.T) {
	s, dir := newStarter(t)
	ctx := context.Background()
	p, err := s.Start(ctx, spec(dir, "live-orphan", "/bin/sh", "-c", "sleep 100 & sleep 100"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := syscall.Kill(readShimPid(t, filepath.Join(dir, "state", "live-orphan")), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	es, err := p.Wait(ctx)
	if err != nil || !es.Unknown {
		t.Errorf("Wait: %+v %v", es, err)
	}
	poll.Until(t, 2*time.Second, "the dead shim's workload group to end", func() bool {
		// Zombies (re-parented to init) still count for kill(0): look at
		// the group's states too.
		return errors.Is(syscall.Kill(-p.Pid(), 0), syscall.ESRCH) || groupGone(p.Pid())
	})
}

func groupGone(pgid int) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		var pid, ppid, pgrp int
		var comm, state string
		if n, _ := fmt.Sscanf(string(b), "%d %s %s %d %d", &pid, &comm, &state, &ppid, &pgrp); n == 5 && pgrp == pgid && state != "Z" {
			return false
		}
	}
	return true
}

func readShimPid(t *testing.T, stateDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "shim.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		ShimPid int `json:"shimPid"`
	}
	if err := jsonUnmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r.ShimPid
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
