package daemon

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// ttyReader collects a TTY exec's output and lets the test wait for text.
type ttyReader struct {
	t    *testing.T
	out  chan []byte
	exit chan *runtimev1.ExitStatus
	buf  strings.Builder
}

func newTTYReader(t *testing.T, recv func() ([]byte, []byte, *runtimev1.ExitStatus, error)) *ttyReader {
	r := &ttyReader{t: t, out: make(chan []byte, 64), exit: make(chan *runtimev1.ExitStatus, 1)}
	go func() {
		defer close(r.out)
		for {
			o, e, ex, err := recv()
			if err != nil {
				return
			}
			if len(e) > 0 {
				r.out <- append([]byte("[stderr]"), e...)
			}
			if len(o) > 0 {
				r.out <- o
			}
			if ex != nil {
				r.exit <- ex
			}
		}
	}()
	return r
}

// waitFor reads until the output so far contains want.
func (r *ttyReader) waitFor(want string) string {
	r.t.Helper()
	deadline := time.After(10 * time.Second)
	for !strings.Contains(r.buf.String(), want) {
		select {
		case b, ok := <-r.out:
			if !ok {
				r.t.Fatalf("stream ended before %q; output %q", want, r.buf.String())
			}
			r.buf.Write(b)
		case <-deadline:
			r.t.Fatalf("no %q within 10s; output %q", want, r.buf.String())
		}
	}
	return r.buf.String()
}

func (r *ttyReader) waitExit() *runtimev1.ExitStatus {
	r.t.Helper()
	select {
	case ex := <-r.exit:
		return ex
	case <-time.After(10 * time.Second):
		r.t.Fatalf("no exit status; output %q", r.buf.String())
	}
	return nil
}

func TestIntegrationExecTTY(t *testing.T) {
	e := newEnv(t)
	spec := e.podSpec("tty")
	e.create(spec)
	e.waitFor(spec.Uid, "running", 30*time.Second, running)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// An exec command is run as given: no $(VAR) expansion, $$ stays.
	lit, err := e.c.Runtime.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lit.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Start{Start: &runtimev1.ExecStart{PodUid: spec.Uid,
		Command: []string{"printf", "%s|%s", "$(HOSTNAME)", "$$"}}}})
	rl := newTTYReader(t, func() ([]byte, []byte, *runtimev1.ExitStatus, error) {
		m, err := lit.Recv()
		return m.GetStdout(), m.GetStderr(), m.GetExit(), err
	})
	rl.waitFor("$(HOSTNAME)|$$")
	if ex := rl.waitExit(); ex.GetExitCode() != 0 {
		t.Fatalf("printf exit %v", ex)
	}

	ex, err := e.c.Runtime.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *runtimev1.ExecRequest) {
		t.Helper()
		if err := ex.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Start{Start: &runtimev1.ExecStart{PodUid: spec.Uid,
		Command: []string{"sh"}, Tty: true, Stdin: true, InitialSize: &runtimev1.TerminalSize{Width: 100, Height: 30}}}})
	r := newTTYReader(t, func() ([]byte, []byte, *runtimev1.ExitStatus, error) {
		m, err := ex.Recv()
		return m.GetStdout(), m.GetStderr(), m.GetExit(), err
	})
	stdin := func(s string) {
		send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Stdin{Stdin: []byte(s)}})
	}
	// A real terminal: stdin is a tty, the initial size applies, the line
	// discipline echoes what is typed and maps \n to \r\n.
	stdin("test -t 0 && echo IS-A-$((6*7))-TTY; stty size\n")
	out := r.waitFor("30 100\r\n")
	if !strings.Contains(out, "test -t 0 && echo IS-A-$((6*7))-TTY") || !strings.Contains(out, "IS-A-42-TTY\r\n") {
		t.Fatalf("no echo or no tty: %q", out)
	}
	// Resize reaches the terminal.
	send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Resize{Resize: &runtimev1.TerminalSize{Width: 132, Height: 43}}})
	time.Sleep(100 * time.Millisecond)
	stdin("stty size\n")
	r.waitFor("43 132\r\n")
	// ^C reaches the foreground job through the terminal, the shell lives on.
	stdin("sleep 30\n")
	time.Sleep(300 * time.Millisecond)
	stdin("\x03")
	stdin("echo after-$((1+1))\n")
	r.waitFor("after-2\r\n")
	// The exit code comes back.
	stdin("exit 7\n")
	if ex := r.waitExit(); ex.GetExitCode() != 7 || ex.GetError() != "" {
		t.Fatalf("exit %v", ex)
	}

	// close_stdin on a terminal is end-of-input (^D): cat ends, exit 0.
	ex2, err := e.c.Runtime.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ex2.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Start{Start: &runtimev1.ExecStart{PodUid: spec.Uid,
		Command: []string{"cat"}, Tty: true, Stdin: true}}})
	r2 := newTTYReader(t, func() ([]byte, []byte, *runtimev1.ExitStatus, error) {
		m, err := ex2.Recv()
		return m.GetStdout(), m.GetStderr(), m.GetExit(), err
	})
	ex2.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Stdin{Stdin: []byte("ping\n")}})
	r2.waitFor("ping\r\nping\r\n") // the echo, then cat's copy
	ex2.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_CloseStdin{CloseStdin: true}})
	if ex := r2.waitExit(); ex.GetExitCode() != 0 {
		t.Fatalf("cat exit %v", ex)
	}
}

func TestIntegrationAttach(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// stdin: true keeps the container's stdin open: what one attached client
	// types, the container reads; its output reaches every attached client
	// and the CRI log.
	spec := e.podSpec("att", "echo:started", "cat", "exit:4")
	spec.Containers[0].Stdin, spec.Containers[0].StdinOnce = true, true
	e.create(spec)
	e.waitFor(spec.Uid, "running", 30*time.Second, running)
	e.waitLog(spec.Uid, "started")

	attach := func(stdin bool) (runtimev1.Runtime_AttachClient, *ttyReader) {
		a, err := e.c.Runtime.Attach(ctx)
		if err != nil {
			t.Fatal(err)
		}
		a.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_Start{Start: &runtimev1.AttachStart{PodUid: spec.Uid, Container: "main", Stdin: stdin}}})
		return a, newTTYReader(t, func() ([]byte, []byte, *runtimev1.ExitStatus, error) {
			m, err := a.Recv()
			return m.GetStdout(), m.GetStderr(), m.GetExit(), err
		})
	}
	_, watcher := attach(false)
	a, r := attach(true)
	time.Sleep(200 * time.Millisecond) // both registered with the shim
	a.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_Stdin{Stdin: []byte("typed line\n")}})
	r.waitFor("typed line\n")
	watcher.waitFor("typed line\n")
	if strings.Contains(r.buf.String(), "started") {
		t.Errorf("attach replayed earlier output: %q", r.buf.String())
	}
	e.waitLog(spec.Uid, "typed line")
	// stdinOnce: this client closing stdin closes the container's: cat ends
	// and the container exits 4, which every attached client is told.
	a.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_CloseStdin{CloseStdin: true}})
	if ex := r.waitExit(); ex.GetExitCode() != 4 {
		t.Fatalf("attach exit %v", ex)
	}
	if ex := watcher.waitExit(); ex.GetExitCode() != 4 {
		t.Fatalf("watcher exit %v", ex)
	}

	// stdin on a container without `stdin: true` is refused with the fix.
	plain := e.podSpec("plain")
	e.create(plain)
	e.waitFor(plain.Uid, "running", 30*time.Second, running)
	a2, err := e.c.Runtime.Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a2.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_Start{Start: &runtimev1.AttachStart{PodUid: plain.Uid, Stdin: true}}})
	if _, err := a2.Recv(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "stdin: true") {
		t.Fatalf("attach -i without stdin: %v", err)
	}
	// Unknown pod.
	a3, _ := e.c.Runtime.Attach(ctx)
	a3.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_Start{Start: &runtimev1.AttachStart{PodUid: "nope"}}})
	if _, err := a3.Recv(); status.Code(err) != codes.NotFound {
		t.Fatalf("attach to unknown pod: %v", err)
	}
}

// The shim holds the container's stdio, so a daemon restarted after kill -9
// attaches to a container the earlier daemon started, stdin included.
func TestIntegrationAttachAfterDaemonKill9(t *testing.T) {
	e := newSubprocessEnv(t)
	dir := e.dir
	d1 := e.startSubprocess()
	t.Cleanup(func() {
		e.deleteAll()
		os.RemoveAll(dir)
	})
	spec := e.podSpec("cat", "cat")
	spec.Containers[0].Stdin = true
	e.create(spec)
	e.waitFor(spec.Uid, "running", 30*time.Second, running)

	d1.Process.Signal(syscall.SIGKILL)
	e.c.Close()
	d2 := e.startSubprocess()
	defer func() {
		e.deleteAll()
		d2.Process.Signal(syscall.SIGTERM)
	}()
	e.waitFor(spec.Uid, "running after re-attach", 30*time.Second, running)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := e.c.Runtime.Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_Start{Start: &runtimev1.AttachStart{PodUid: spec.Uid, Stdin: true}}})
	r := newTTYReader(t, func() ([]byte, []byte, *runtimev1.ExitStatus, error) {
		m, err := a.Recv()
		return m.GetStdout(), m.GetStderr(), m.GetExit(), err
	})
	time.Sleep(200 * time.Millisecond)
	a.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_Stdin{Stdin: []byte("after the restart\n")}})
	r.waitFor("after the restart\n")
	e.waitLog(spec.Uid, "after the restart")
}
