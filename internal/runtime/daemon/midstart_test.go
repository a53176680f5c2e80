package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// A daemon killed -9 while it starts a burst of pods leaves containers in
// every stage of the start: recorded as started (hasRun) but waiting for a
// start slot, or with a shim spawned that has not reported yet. The next
// daemon adopts the shims that start their process and starts the others
// for the first time: every pod runs exactly once, restartCount 0, with
// one shim.
func TestIntegrationDaemonKill9MidStart(t *testing.T) {
	e := newSubprocessEnv(t)
	dir := e.dir
	// A shim slow to start: the first daemon dies while the shims it
	// spawned have not reported yet (and hold every start slot).
	slow := filepath.Join(t.TempDir(), "slow-shim")
	if err := os.WriteFile(slow, []byte("#!/bin/sh\nsleep 1.5\nexec "+shimBin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d1 := e.startSubprocessShim(slow)
	t.Cleanup(func() {
		e.deleteAll()
		os.RemoveAll(dir)
	})

	n := 4 * runtime.NumCPU() // twice the daemon's start slots
	var pods []*runtimev1.PodSpec
	for i := 0; i < n; i++ {
		s := e.podSpec("burst", "forever")
		e.create(s)
		pods = append(pods, s)
	}
	// Kill once every container is recorded as started and some shims
	// were spawned (and are still sleeping).
	poll.UntilNil(t, 30*time.Second, "every container recorded as started and a shim spawned", func() error {
		recorded, spawned := 0, 0
		for _, s := range pods {
			var pp struct {
				Containers []struct {
					HasRun bool `json:"hasRun"`
				} `json:"containers"`
			}
			b, _ := os.ReadFile(filepath.Join(dir, "pods", s.Uid, "pod.json"))
			if json.Unmarshal(b, &pp) == nil && len(pp.Containers) == 1 && pp.Containers[0].HasRun {
				recorded++
			}
			if _, err := os.Stat(filepath.Join(dir, "pods", s.Uid, "attempts", "main", "0", "config.json")); err == nil {
				spawned++
			}
		}
		if recorded == n && spawned > 0 {
			return nil
		}
		return fmt.Errorf("%d of %d containers recorded as started, %d shims spawned", recorded, n, spawned)
	})
	d1.Process.Signal(syscall.SIGKILL)
	e.c.Close()
	time.Sleep(200 * time.Millisecond)

	d2 := e.startSubprocess()
	defer func() {
		e.deleteAll()
		d2.Process.Signal(syscall.SIGTERM)
	}()
	for _, s := range pods {
		e.waitFor(s.Uid, "Running", 60*time.Second, running)
	}
	time.Sleep(2 * time.Second) // a second attempt would have started by now
	for _, s := range pods {
		st := e.status(s.Uid)
		if !running(st) || ctrState(st).GetRestartCount() != 0 {
			t.Errorf("pod %s after the daemon died mid-start:\n%s", s.Uid, prettyStatus(st))
		}
		if got := shimsOf(t, filepath.Join(dir, "pods", s.Uid)); got != 1 {
			t.Errorf("pod %s has %d shims", s.Uid, got)
		}
	}
}

// shimsOf counts the live shims (or slow-shim wrappers) of the pod in dir:
// processes whose arguments name one of its attempts' state directories.
func shimsOf(t *testing.T, dir string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	n := 0
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, arg := range strings.Split(string(b), "\x00") {
			if strings.HasPrefix(arg, filepath.Join(dir, "attempts")+"/") {
				n++
				break
			}
		}
	}
	return n
}
