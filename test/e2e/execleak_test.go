package e2e

import (
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pidAlive: the process exists and is not a zombie.
func pidAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || !strings.HasPrefix(string(b[i+1:]), " Z")
}

func waitPidGone(t *testing.T, what string, pid int) {
	t.Helper()
	// Not poll: a process left running is reported (Errorf) and killed,
	// and the test goes on.
	deadline := time.Now().Add(5 * time.Second)
	for pidAlive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("%s (pid %d) still runs", what, pid)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestExecLeavesNoProcesses: what `kubectl exec` starts in the background
// does not outlive the exec, and an exec still running when its pod is
// deleted ends with the pod.
func TestExecLeavesNoProcesses(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	s.deletePodsAtCleanup(t)
	s.createPod(t, nativePod("execleak", imgs.prog))
	waitPod(t, c, "execleak", 2*time.Minute, running)

	for _, script := range []string{
		"sleep 1000 >/dev/null 2>&1 </dev/null & echo $! " + imagetest.PidNSSuffix, // detached: the exec returns at once
		"sleep 1001 & echo $! " + imagetest.PidNSSuffix,                            // holds the exec's output
	} {
		t0 := time.Now()
		cmd := s.kubectlCmd("exec", "execleak", "--", "sh", "-c", script)
		var buf outBuf
		cmd.Stdout, cmd.Stderr = &buf, &buf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Bounded: a background child holding the output used to keep
		// the exec open for as long as it ran.
		timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
		err := cmd.Wait()
		timer.Stop()
		out := buf.String()
		if d := time.Since(t0); d > 20*time.Second {
			t.Errorf("exec %q took %s: its background child kept it open", script, d)
		}
		if err != nil {
			t.Errorf("exec %q: %v %q", script, err, out)
		}
		// The pid is in the pod's pid namespace: translated while it lives.
		pid, err := imagetest.HostPid(out)
		if err != nil {
			if strings.Contains(err.Error(), "it ended") {
				continue
			}
			t.Fatalf("exec %q printed %q: %v", script, out, err)
		}
		waitPidGone(t, "background child of `kubectl exec -- sh -c '"+script+"'`", pid)
	}

	// An exec still running when the pod is deleted.
	cmd := s.kubectlCmd("exec", "execleak", "--", "sh", "-c", "sleep 1002 & echo $! "+imagetest.PidNSSuffix+"; wait")
	out := &outBuf{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var pid int
	waitFor(t, 30*time.Second, "the exec's pid", func() error {
		var err error
		pid, err = imagetest.HostPid(out.String())
		return err
	})
	s.deletePod(t, "execleak", 1)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Error("kubectl exec still runs after its pod was deleted")
	}
	waitPidGone(t, "child of an exec whose pod was deleted", pid)
}
