package daemon

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/pod"
	"github.com/k3sm-dev/k3sm/internal/runtime/procgroup"
	"github.com/k3sm-dev/k3sm/internal/runtime/shimclient"
)

// ------------------------------------------------------------------ exec

// Exec runs a command in the container's context: its root, env and working
// directory, resolved as the container's own command is. With tty the
// command gets a new session on a pseudo-terminal (stdout and stderr are
// the terminal, as with the kubelet) and resize messages set its size.
// The command runs in its own process group, killed when the stream ends.
func (s *server) Exec(stream runtimev1.Runtime_ExecServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "exec: the first message must carry ExecStart")
	}
	if len(start.GetCommand()) == 0 {
		return status.Error(codes.InvalidArgument, "exec: command is empty")
	}
	info, err := s.mgr.Container(start.GetPodUid(), start.GetContainer())
	if err != nil {
		return grpcErr(err)
	}
	if info.Pid == 0 {
		return status.Errorf(codes.FailedPrecondition, "container %q is not running", info.Spec.GetName())
	}
	var mu sync.Mutex
	send := func(r *runtimev1.ExecResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	exitMsg := func(es *runtimev1.ExitStatus) *runtimev1.ExecResponse {
		return &runtimev1.ExecResponse{Msg: &runtimev1.ExecResponse_Exit{Exit: es}}
	}
	// The kubelet runs an exec command as given: the container's $(VAR)
	// expansion must not apply, so every $ is escaped for it.
	command := make([]string, len(start.GetCommand()))
	for i, a := range start.GetCommand() {
		command[i] = strings.ReplaceAll(a, "$", "$$")
	}
	// The terminal first: darwin's profile must name it (sandbox.WithTTY).
	var ptmx, tty *os.File
	ttyName := ""
	if start.GetTty() {
		if ptmx, tty, err = pty.Open(); err != nil {
			return status.Errorf(codes.Internal, "exec: open a pseudo-terminal: %v", err)
		}
		defer ptmx.Close()
		defer tty.Close()
		ttyName = tty.Name()
	}
	argv, env, dir, err := s.mgr.ResolveExec(info, command, ttyName)
	if err != nil {
		return send(exitMsg(&runtimev1.ExitStatus{ExitCode: 127, Error: err.Error()}))
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = env, dir

	var (
		writeIn func([]byte)
		closeIn func()
		resize  = func(*runtimev1.TerminalSize) {}
		outputs []io.Reader // stdout, stderr
		drain   func()      // waits for the outputs after the process exited
	)
	var wg sync.WaitGroup
	if start.GetTty() {
		if sz := start.GetInitialSize(); sz.GetWidth() > 0 && sz.GetHeight() > 0 {
			pty.Setsize(ptmx, &pty.Winsize{Cols: uint16(sz.GetWidth()), Rows: uint16(sz.GetHeight())})
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		// A new session with the terminal as its controlling tty (fd 0 in
		// the child), so job control, ^C and SIGWINCH behave.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := cmd.Start(); err != nil {
			tty.Close()
			return send(exitMsg(&runtimev1.ExitStatus{ExitCode: 126, Error: err.Error()}))
		}
		tty.Close()
		var wmu sync.Mutex
		writeIn = func(b []byte) { wmu.Lock(); ptmx.Write(b); wmu.Unlock() }
		// A terminal has no half close: end of input is ^D, as a user
		// would type it.
		closeIn = func() { writeIn([]byte{4}) }
		resize = func(sz *runtimev1.TerminalSize) {
			if sz.GetWidth() > 0 && sz.GetHeight() > 0 {
				pty.Setsize(ptmx, &pty.Winsize{Cols: uint16(sz.GetWidth()), Rows: uint16(sz.GetHeight())})
			}
		}
		outputs = []io.Reader{ptmx, nil}
		drain = func() {
			// The master reads EIO once every holder of the terminal closed
			// it; a background process may keep it open: give up after a
			// moment.
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				ptmx.Close()
				<-done
			}
		}
	} else {
		// Its own group, so the whole command tree ends with the stream.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		var stdin io.WriteCloser
		if start.GetStdin() {
			if stdin, err = cmd.StdinPipe(); err != nil {
				return status.Error(codes.Internal, err.Error())
			}
		}
		if err := cmd.Start(); err != nil {
			return send(exitMsg(&runtimev1.ExitStatus{ExitCode: 126, Error: err.Error()}))
		}
		writeIn, closeIn = func([]byte) {}, func() {}
		if stdin != nil {
			writeIn = func(b []byte) { stdin.Write(b) }
			closeIn = func() { stdin.Close() }
		}
		outputs = []io.Reader{stdout, stderr}
		// Pipes: Wait may only run after the reads finished.
		drain = wg.Wait
		if procgroup.WaitsWithoutReaping {
			// Drained after the command exited and its group was killed:
			// only a descendant that left the group can still hold the
			// pipes; give up on it after a moment.
			drain = func() {
				done := make(chan struct{})
				go func() { wg.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(2 * time.Second):
					stdout.Close()
					stderr.Close()
					<-done
				}
			}
		}
	}
	// The command's group (with a TTY its session) is killed when the
	// command exits, when the stream ends, and when the container exits
	// (its pod deleted or the container restarted), as a pid namespace
	// would: nothing an exec started outlives it.
	g := procgroup.New(cmd.Process.Pid, start.GetTty())
	stop := context.AfterFunc(stream.Context(), func() { g.Signal(syscall.SIGKILL) })
	defer stop()
	ctrCtx, ctrGone := context.WithCancel(context.Background())
	defer ctrGone()
	go func() {
		if _, err := info.Proc.Wait(ctrCtx); err == nil {
			g.Signal(syscall.SIGKILL)
		}
	}()
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				if !start.GetTty() {
					closeIn()
				}
				return
			}
			switch {
			case m.GetResize() != nil:
				resize(m.GetResize())
			case m.GetCloseStdin():
				closeIn()
			case m.GetStdin() != nil && start.GetStdin():
				writeIn(m.GetStdin())
			}
		}
	}()
	pump := func(r io.Reader, mk func([]byte) *runtimev1.ExecResponse) {
		defer wg.Done()
		buf := make([]byte, 32*1024)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if send(mk(append([]byte(nil), buf[:n]...))) != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(1)
	go pump(outputs[0], func(b []byte) *runtimev1.ExecResponse {
		return &runtimev1.ExecResponse{Msg: &runtimev1.ExecResponse_Stdout{Stdout: b}}
	})
	if outputs[1] != nil {
		wg.Add(1)
		go pump(outputs[1], func(b []byte) *runtimev1.ExecResponse {
			return &runtimev1.ExecResponse{Msg: &runtimev1.ExecResponse_Stderr{Stderr: b}}
		})
	}
	var werr error
	if start.GetTty() {
		werr = g.Wait(nil, cmd.Wait)
		drain()
	} else {
		werr = g.Wait(drain, cmd.Wait)
	}
	es := &runtimev1.ExitStatus{}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		es.Signal = int32(ws.Signal())
		es.ExitCode = 128 + es.Signal
	} else if cmd.ProcessState != nil {
		es.ExitCode = int32(cmd.ProcessState.ExitCode())
	} else if werr != nil {
		es.ExitCode, es.Error = 255, werr.Error()
	}
	return send(exitMsg(es))
}

// ---------------------------------------------------------------- attach

// Attach connects the stream to the running container's stdio through its
// shim: output from now on (the CRI log keeps being written), and stdin when
// the container has `stdin: true`. The stream ends with the container's exit
// status when it exits. Resize messages reach a `tty: true` container's
// terminal.
func (s *server) Attach(stream runtimev1.Runtime_AttachServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "attach: the first message must carry AttachStart")
	}
	info, err := s.mgr.Container(start.GetPodUid(), start.GetContainer())
	if err != nil {
		return grpcErr(err)
	}
	if info.Proc == nil {
		return status.Errorf(codes.FailedPrecondition, "container %q is not running", info.Spec.GetName())
	}
	att, ok := info.Proc.(pod.Attachable)
	if !ok {
		return status.Error(codes.Unimplemented, "attach: this runtime's process starter cannot attach")
	}
	if start.GetStdin() && !info.Spec.GetStdin() {
		return status.Errorf(codes.FailedPrecondition, "attach: container %q does not keep stdin open: set `stdin: true` in its spec, or attach without -i", info.Spec.GetName())
	}
	conn, err := att.AttachStdio(stream.Context(), start.GetStdin())
	if errors.Is(err, shimclient.ErrNotRunning) {
		return status.Errorf(codes.FailedPrecondition, "container %q is not running", info.Spec.GetName())
	}
	if err != nil {
		return status.Errorf(codes.Unavailable, "attach to container %q: %v", info.Spec.GetName(), err)
	}
	defer conn.Close()
	stop := context.AfterFunc(stream.Context(), func() { conn.Close() })
	defer stop()
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				// The client left: its stdin is done (stdinOnce applies).
				if start.GetStdin() {
					conn.CloseStdin()
				}
				conn.Close()
				return
			}
			switch {
			case m.GetResize() != nil:
				conn.Resize(uint16(m.GetResize().GetWidth()), uint16(m.GetResize().GetHeight()))
			case m.GetCloseStdin():
				conn.CloseStdin()
			case m.GetStdin() != nil && start.GetStdin():
				if conn.SendStdin(m.GetStdin()) != nil {
					return
				}
			}
		}
	}()
	for {
		out, errb, exit, err := conn.Recv()
		if err != nil {
			if stream.Context().Err() != nil {
				return nil
			}
			if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
				return status.Errorf(codes.Unavailable, "attach to container %q: the shim ended the stream (too slow a reader, or the shim exited)", info.Spec.GetName())
			}
			return status.Errorf(codes.Unavailable, "attach to container %q: %v", info.Spec.GetName(), err)
		}
		var r *runtimev1.AttachResponse
		switch {
		case exit != nil:
			return stream.Send(&runtimev1.AttachResponse{Msg: &runtimev1.AttachResponse_Exit{Exit: &runtimev1.ExitStatus{
				ExitCode: int32(exit.ExitCode), Signal: int32(exit.Signal)}}})
		case len(out) > 0:
			r = &runtimev1.AttachResponse{Msg: &runtimev1.AttachResponse_Stdout{Stdout: out}}
		case len(errb) > 0:
			r = &runtimev1.AttachResponse{Msg: &runtimev1.AttachResponse_Stderr{Stderr: errb}}
		default:
			continue
		}
		if err := stream.Send(r); err != nil {
			return err
		}
	}
}
