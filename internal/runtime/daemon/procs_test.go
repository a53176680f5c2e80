package daemon

import (
	"context"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// execStream starts an exec and returns a function that collects its
// output until the exit message (or the stream ends).
func (e *env) execStream(ctx context.Context, start *runtimev1.ExecStart) (runtimev1.Runtime_ExecClient, func() (string, *runtimev1.ExitStatus)) {
	e.t.Helper()
	ex, err := e.c.Runtime.Exec(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := ex.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Start{Start: start}}); err != nil {
		e.t.Fatal(err)
	}
	return ex, func() (string, *runtimev1.ExitStatus) {
		var out strings.Builder
		for {
			m, err := ex.Recv()
			if err != nil {
				return out.String(), nil
			}
			out.Write(m.GetStdout())
			out.Write(m.GetStderr())
			if m.GetExit() != nil {
				return out.String(), m.GetExit()
			}
		}
	}
}

func waitGone(t *testing.T, what string, pid int) {
	t.Helper()
	// Not poll: a process left running is reported (Errorf) and killed,
	// and the test goes on.
	for i := 0; i < 100; i++ {
		if !processAlive(pid) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("%s (pid %d) still runs", what, pid)
	syscallKill(pid)
}

// Nothing an exec starts outlives it: a background child is killed when
// the exec's command exits (with or without a terminal, whether or not it
// holds the exec's output), and an exec still running when its pod is
// deleted is killed with the pod.
func TestIntegrationExecLeavesNoProcesses(t *testing.T) {
	e := newEnv(t)
	tmp := t.TempDir()
	spec := e.podSpec("execleak", "forever")
	e.create(spec)
	e.waitFor(spec.Uid, "Running", 30*time.Second, running)

	cases := []struct {
		name string
		tty  bool
		cmd  string
	}{
		// kubectl exec pod -- sh -c 'sleep 1000 &' with the output
		// redirected: the exec returns at once, the sleep stayed.
		{"detached", false, "sleep 1000 >/dev/null 2>&1 </dev/null & echo $! " + imagetest.PidNSSuffix + " > %s"},
		// The background child holds the exec's stdout: the exec used to
		// hang until the child ended.
		{"holding-output", false, "sleep 1000 & echo $! " + imagetest.PidNSSuffix + " > %s"},
		{"tty", true, "sleep 1000 & echo $! " + imagetest.PidNSSuffix + " > %s"},
	}
	for _, c := range cases {
		pidFile := filepath.Join(tmp, c.name+".pid")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		t0 := time.Now()
		_, collect := e.execStream(ctx, &runtimev1.ExecStart{PodUid: spec.Uid, Tty: c.tty,
			Command: []string{"/bin/sh", "-c", strings.Replace(c.cmd, "%s", pidFile, 1)}})
		_, exit := collect()
		cancel()
		if exit == nil || exit.GetExitCode() != 0 {
			t.Errorf("%s: exec ended with %v after %s, want exit 0", c.name, exit, time.Since(t0))
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("%s: exec took %s: a background child held it open", c.name, d)
		}
		waitGone(t, c.name+": the exec's background child", readPid(t, pidFile))
	}

	// An exec that still runs when its pod is deleted ends with the pod.
	pidFile := filepath.Join(tmp, "running.pid")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, collect := e.execStream(ctx, &runtimev1.ExecStart{PodUid: spec.Uid,
		Command: []string{"/bin/sh", "-c", "sleep 1000 & echo $! " + imagetest.PidNSSuffix + " > " + pidFile + "; wait"}})
	child := readPid(t, pidFile)
	zero := int64(0)
	if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: spec.Uid, GracePeriodSeconds: &zero, Wait: true}); err != nil {
		t.Fatal(err)
	}
	done := make(chan *runtimev1.ExitStatus, 1)
	go func() { _, ex := collect(); done <- ex }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("the exec still runs after its pod was deleted")
	}
	waitGone(t, "the child of an exec whose pod was deleted", child)
}

func syscallKill(pid int) { syscall.Kill(pid, syscall.SIGKILL) }
