// Package shim is the resident per-container shim (cmd/k3sm-shim): the
// parent of one container's process, holding its stdout/stderr (written to
// disk in the CRI log format) and its exit status (written to a file, so the
// daemon learns it even if the daemon was dead when the process exited). It
// serves a tiny JSON-lines control protocol on its own unix socket.
//
// The shim runs detached from the daemon (own session), so it survives the
// daemon and the server being killed. It links only the standard library and
// this repository's stdlib-only packages: one shim runs per container, so its
// start-up cost and memory are paid per container.
package shim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/runtime/criolog"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"github.com/k3sm-dev/k3sm/internal/runtime/procgroup"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// Files in a shim's state directory.
const (
	ConfigFile = "config.json" // Config, written by the daemon
	ExitFile   = "exit.json"   // ExitStatus, written durably by the shim
	PidFile    = "shim.json"   // State at start (pids), written by the shim
	LogFile    = "shim.log"    // the shim's own stderr
	MountStage = "mnt"         // scratch directory of mounts.Apply
	RootStage  = "root"        // where a sandboxed container's root is built
)

// ReadyFD is the descriptor on which the shim reports start-up: one JSON
// Ready document, then EOF.
const ReadyFD = 3

// Config tells the shim what to run. Paths are absolute.
type Config struct {
	Argv    []string `json:"argv"`
	Env     []string `json:"env"`
	Dir     string   `json:"dir"`
	LogPath string   `json:"logPath"`
	Socket  string   `json:"socket"`
	// Stdin keeps a pipe on the container's stdin open for attached
	// clients (the container's `stdin: true`); otherwise stdin is /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// StdinOnce closes that pipe when the first client that attached with
	// stdin leaves.
	StdinOnce bool `json:"stdinOnce,omitempty"`
	// TTY runs the container on a pseudo-terminal (the container's
	// `tty: true`): stdin, stdout and stderr are the terminal, its output
	// is logged as stdout, attached clients can resize it.
	TTY bool `json:"tty,omitempty"`
	// Mounts are the container's volumes. On Linux the daemon starts the
	// shim in a mount namespace of its own (mounts.SysProcAttr) and the
	// shim applies them there before it starts the workload, which
	// inherits the namespace; elsewhere they become symlinks.
	Mounts []mounts.Mount `json:"mounts,omitempty"`
	// LogMaxSize and LogMaxFiles rotate the log (criolog.Writer.SetRotation:
	// the kubelet's containerLogMaxSize / containerLogMaxFiles); zero size
	// never rotates.
	LogMaxSize  int64 `json:"logMaxSize,omitempty"`
	LogMaxFiles int   `json:"logMaxFiles,omitempty"`
	// Sandbox, when set, is the container's boundary (package sandbox): on
	// Linux the shim builds its root and starts the workload through
	// sandbox.Start; on darwin its Seatbelt profile wraps the workload.
	Sandbox *sandbox.Spec `json:"sandbox,omitempty"`
	// Cgroups are cgroup directories (one per hierarchy) the workload is
	// placed in before it runs: it and everything it forks are accounted
	// and limited there.
	Cgroups []string `json:"cgroups,omitempty"`
	// JoinCgroupsAfterStart moves the workload into Cgroups after it was
	// created even where the kernel could create it there
	// (CLONE_INTO_CGROUP): a benchmark's comparison, never for real use.
	JoinCgroupsAfterStart bool `json:"joinCgroupsAfterStart,omitempty"`
}

// Ready is the start-up report on ReadyFD.
type Ready struct {
	ShimPid   int       `json:"shimPid"`
	Pid       int       `json:"pid"`
	StartedAt time.Time `json:"startedAt"`
	// StartTicks is the workload's start time in clock ticks after boot
	// (Linux /proc/<pid>/stat; 0 elsewhere): with Pid it identifies the
	// process for a daemon that must end it after the shim died.
	StartTicks uint64 `json:"startTicks,omitempty"`
	Error      string `json:"error,omitempty"`
}

// ExitStatus is how the container's main process ended.
type ExitStatus struct {
	ExitCode   int       `json:"exitCode"`
	Signal     int       `json:"signal,omitempty"`
	StartedAt  time.Time `json:"startedAt"`
	FinishedAt time.Time `json:"finishedAt"`
	// Error is set when the process could not be started (exit code 128).
	Error string `json:"error,omitempty"`
}

// Request is one line of the control protocol.
type Request struct {
	Op     string `json:"op"` // status | signal | stop | wait | reopen | attach
	Signal int    `json:"signal,omitempty"`
	// KillAfterMs (stop): the shim itself SIGKILLs the workload's group
	// this long after the request, unless it exited; it replaces any
	// earlier deadline. The deadline lives in the shim, not the daemon, so
	// a container being stopped dies at the end of its grace period even
	// when the daemon exits (or is killed) meanwhile.
	KillAfterMs int64 `json:"killAfterMs,omitempty"`
	// Stdin (attach): the client sends stdin frames.
	Stdin bool `json:"stdin,omitempty"`
}

// Response answers a Request.
type Response struct {
	ShimPid    int       `json:"shimPid"`
	Pid        int       `json:"pid"`
	StartedAt  time.Time `json:"startedAt"`
	StartTicks uint64    `json:"startTicks,omitempty"`
	Running    bool      `json:"running"`
	// BornInCgroup: the kernel created the workload in its cgroup
	// (CLONE_INTO_CGROUP, cgroup v2); else it was moved there before it ran.
	BornInCgroup bool        `json:"bornInCgroup,omitempty"`
	Exit         *ExitStatus `json:"exit,omitempty"`
	Error        string      `json:"error,omitempty"`
}

// Main runs the shim for the state directory given as the only argument and
// returns the process exit code.
func Main(args []string) int {
	if len(args) >= 2 {
		// The same binary enters a container's sandbox (package sandbox).
		switch args[1] {
		case sandbox.InitArg:
			return sandbox.InitMain()
		case sandbox.EnterArg:
			return sandbox.EnterMain(args[1:])
		case sandbox.ExecArg:
			return sandbox.ExecMain(args[1:])
		case sandbox.HoldArg:
			return sandbox.HoldMain()
		case sandbox.DialArg:
			return sandbox.DialMain(args[1:])
		}
	}
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: k3sm-shim <state-dir>")
		return 2
	}
	ready := os.NewFile(ReadyFD, "ready")
	s, err := start(args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "k3sm-shim:", err)
		if ready != nil {
			json.NewEncoder(ready).Encode(Ready{ShimPid: os.Getpid(), Error: err.Error()})
			ready.Close()
		}
		return 1
	}
	if ready != nil {
		json.NewEncoder(ready).Encode(Ready{ShimPid: os.Getpid(), Pid: s.pid, StartedAt: s.startedAt, StartTicks: s.startTicks})
		ready.Close()
	}
	s.run()
	return 0
}

type server struct {
	dir        string
	cfg        Config
	cmd        *exec.Cmd
	pid        int
	group      *procgroup.Group // the workload's group; signals stop once it is reaped
	startTicks uint64
	startedAt  time.Time
	log        *criolog.Writer
	ln         *net.UnixListener
	copiers    sync.WaitGroup
	conns      sync.WaitGroup

	mu     sync.Mutex
	exit   *ExitStatus
	exited chan struct{}
	kill   *time.Timer // the stop deadline, if one was set

	// Attached clients (attach.go).
	amu        sync.Mutex
	clients    map[*attachClient]struct{}
	attachDone bool
	stdinMu    sync.Mutex
	stdin      *os.File // write end of the container's stdin, when Config.Stdin
	pty        *os.File // the terminal's master side, when Config.TTY
	ptyEOF     bool     // end of input was typed (stdinOnce on a terminal)
}

func start(dir string) (*server, error) {
	raw, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, err
	}
	s := &server{dir: dir, exited: make(chan struct{}), clients: map[*attachClient]struct{}{}}
	if err := json.Unmarshal(raw, &s.cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", ConfigFile, err)
	}
	if len(s.cfg.Argv) == 0 {
		return nil, errors.New("config: argv is empty")
	}
	if err := os.MkdirAll(filepath.Dir(s.cfg.LogPath), 0o750); err != nil {
		return nil, err
	}
	if s.log, err = criolog.Create(s.cfg.LogPath); err != nil {
		return nil, err
	}
	s.log.SetRotation(s.cfg.LogMaxSize, s.cfg.LogMaxFiles)
	os.Remove(s.cfg.Socket)
	s.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: s.cfg.Socket, Net: "unix"})
	if err != nil {
		return nil, err
	}
	s.ln.SetUnlinkOnClose(true)
	if err := os.Chmod(s.cfg.Socket, 0o600); err != nil {
		return nil, err
	}
	// darwin: the boundary is a wrapper process (sandbox-exec), applied
	// once the terminal (if any) is open, since the profile must name it.
	seatbelt := s.cfg.Sandbox != nil && s.cfg.Sandbox.Seatbelt != ""
	sandboxed := s.cfg.Sandbox != nil && !seatbelt
	imageRoot := sandboxed && s.cfg.Sandbox.Lower != ""
	if len(s.cfg.Mounts) > 0 && !sandboxed {
		if err := mounts.Apply(s.cfg.Mounts, filepath.Join(dir, MountStage)); err != nil {
			s.failStart(time.Now(), err)
			return nil, err
		}
	}

	var outR, outW, errR, errW, stdinR *os.File
	// Its own process group, so the daemon can signal the container (and
	// everything it forked) as one.
	attrs := &syscall.SysProcAttr{Setpgid: true}
	if s.cfg.TTY {
		// A new session (its id is the group id signals go to) with the
		// terminal as controlling tty (fd 0 in the child).
		if s.pty, stdinR, err = pty.Open(); err != nil {
			return nil, fmt.Errorf("open a pseudo-terminal: %w", err)
		}
		outR, outW, errW = s.pty, stdinR, stdinR
		attrs = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	} else {
		if outR, outW, err = os.Pipe(); err != nil {
			return nil, err
		}
		if errR, errW, err = os.Pipe(); err != nil {
			return nil, err
		}
		if s.cfg.Stdin {
			if stdinR, s.stdin, err = os.Pipe(); err != nil {
				return nil, err
			}
		} else if stdinR, err = os.Open(os.DevNull); err != nil {
			return nil, err
		}
	}
	if seatbelt {
		spec := s.cfg.Sandbox
		if s.cfg.TTY {
			if spec, err = sandbox.WithTTY(spec, stdinR.Name()); err != nil {
				return nil, err
			}
		}
		s.cfg.Argv = sandbox.WrapArgv(spec, s.cfg.Argv)
		s.cfg.Sandbox = nil
	}
	startWorkload := func() error { return s.startWorkload(stdinR, outW, errW, attrs) }
	var startErr error
	if sandboxed {
		// The container's own root, namespaces and restrictions (package
		// sandbox); the volumes are mounted inside that root, or on the
		// host's view of an `image: native` container.
		s.startedAt = time.Now()
		stage := ""
		if imageRoot {
			stage = filepath.Join(dir, RootStage)
		}
		s.cmd, startErr = sandbox.Start(s.cfg.Sandbox, s.cfg.Mounts, stage, filepath.Join(dir, MountStage), s.cfg.Cgroups, s.cfg.JoinCgroupsAfterStart,
			s.cfg.Argv, s.cfg.Env, s.cfg.Dir, stdinR, outW, errW, attrs)
	} else if len(s.cfg.Mounts) > 0 {
		// Without the capability an unprivileged daemon's shim mounts
		// with (mounts.SysProcAttr).
		startErr = mounts.StartWithoutCaps(startWorkload)
	} else {
		startErr = startWorkload()
	}
	// With a terminal these are one file: closing it again is harmless.
	outW.Close()
	errW.Close()
	stdinR.Close()
	if startErr != nil {
		s.closeStdin()
		outR.Close()
		if errR != nil {
			errR.Close()
		}
		s.failStart(s.startedAt, startErr)
		return nil, startErr
	}
	s.pid = s.cmd.Process.Pid
	if sandboxed {
		// Placed before it ran.
	} else if err := sandbox.JoinCgroups(s.cfg.Cgroups, s.pid); err != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		outR.Close()
		if errR != nil {
			errR.Close()
		}
		s.failStart(s.startedAt, err)
		return nil, err
	}
	// A terminal's container leads its own session (Setsid): its
	// background jobs end with it too.
	s.group = procgroup.New(s.pid, s.cfg.TTY)
	s.startTicks = procgroup.StartTicks(s.pid) // a child not yet reaped: its own
	st, _ := json.Marshal(Response{ShimPid: os.Getpid(), Pid: s.pid, StartedAt: s.startedAt, StartTicks: s.startTicks, Running: true, BornInCgroup: sandbox.BornInCgroup(s.cmd)})
	// Atomic, not fsynced: it describes processes that cannot outlive a
	// crash of the machine, and it is on every container's start path.
	if err := atomicfile.WriteFileNoSync(filepath.Join(dir, PidFile), st, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm-shim: write", PidFile+":", err)
	}

	s.copiers.Add(1)
	go s.copy(criolog.Stdout, outR, FrameStdout)
	if errR != nil {
		s.copiers.Add(1)
		go s.copy(criolog.Stderr, errR, FrameStderr)
	}
	return s, nil
}

// startWorkload starts the container's process (s.cmd).
func (s *server) startWorkload(stdin, stdout, stderr *os.File, attrs *syscall.SysProcAttr) error {
	for try := 0; ; try++ {
		s.cmd = &exec.Cmd{
			Path:        s.cfg.Argv[0],
			Args:        s.cfg.Argv,
			Env:         s.cfg.Env,
			Dir:         s.cfg.Dir,
			Stdin:       stdin,
			Stdout:      stdout,
			Stderr:      stderr,
			SysProcAttr: attrs,
		}
		s.startedAt = time.Now()
		err := s.cmd.Start()
		// ETXTBSY: a process forked by the daemon while it was writing
		// this binary into the pod root still holds the write descriptor
		// until it execs (golang.org/issue/22315). It lasts milliseconds.
		if !errors.Is(err, syscall.ETXTBSY) || try == 100 {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// failStart records a start failure durably too (the daemon may not be
// listening): in the CRI log and as the exit status.
func (s *server) failStart(started time.Time, err error) {
	msg := err.Error()
	s.log.WriteRecord(criolog.Stderr, false, []byte("k3sm-shim: "+msg))
	writeExit(s.dir, &ExitStatus{ExitCode: 128, StartedAt: started, FinishedAt: time.Now(), Error: msg})
	s.ln.Close()
}

// eioIsEOF ends a terminal's output: the master side reads EIO once every
// process closed the terminal.
type eioIsEOF struct{ r io.Reader }

func (e eioIsEOF) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if errors.Is(err, syscall.EIO) {
		err = io.EOF
	}
	return n, err
}

// copy writes the stream to the CRI log and to attached clients.
func (s *server) copy(stream string, r *os.File, kind byte) {
	defer s.copiers.Done()
	defer r.Close()
	if err := s.log.Copy(stream, io.TeeReader(eioIsEOF{r}, fanout{s, kind})); err != nil {
		fmt.Fprintf(os.Stderr, "k3sm-shim: copy %s: %v\n", stream, err)
	}
}

// run serves the socket until the process has exited and every waiter has
// its answer.
func (s *server) run() {
	go s.accept()
	// The container ends with its main process, as with a pid namespace:
	// whatever it left behind in its group goes too, killed while the
	// exited (not yet reaped) process still holds the group's number.
	// From then on signals are refused (they could reach a process that
	// got the number later).
	werr := s.group.Wait(nil, s.cmd.Wait)
	finished := time.Now()
	es := &ExitStatus{StartedAt: s.startedAt, FinishedAt: finished}
	if ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		es.Signal = int(ws.Signal())
		es.ExitCode = 128 + es.Signal
	} else if s.cmd.ProcessState != nil {
		es.ExitCode = s.cmd.ProcessState.ExitCode()
	} else if werr != nil {
		es.ExitCode, es.Error = 255, werr.Error()
	}
	done := make(chan struct{})
	go func() { s.copiers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		// A descendant that left the group still holds the pipe.
	}
	s.log.Close()
	// Not inline: a write blocked on a full pipe (a descendant still holds
	// its read end) must not hold up the exit status.
	if s.pty == nil {
		go s.closeStdin()
	}
	if err := writeExit(s.dir, es); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm-shim: write exit status:", err)
	}
	s.mu.Lock()
	s.exit = es
	close(s.exited)
	s.mu.Unlock()
	s.finishClients(es)
	// Give connected waiters their answer, then go away; a daemon that
	// connects later reads the exit file.
	waited := make(chan struct{})
	go func() { s.conns.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(2 * time.Second):
	}
	s.ln.Close()
}

func (s *server) accept() {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		s.conns.Add(1)
		go s.serve(c)
	}
}

func (s *server) state() Response {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Response{ShimPid: os.Getpid(), Pid: s.pid, StartedAt: s.startedAt, StartTicks: s.startTicks, Running: s.exit == nil, BornInCgroup: sandbox.BornInCgroup(s.cmd), Exit: s.exit}
}

func (s *server) serve(c *net.UnixConn) {
	defer s.conns.Done()
	defer c.Close()
	br := bufio.NewReader(c)
	enc := json.NewEncoder(c)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return
		}
		var req Request
		if err := json.Unmarshal(line, &req); err != nil {
			enc.Encode(Response{Error: "bad request: " + err.Error()})
			return
		}
		var resp Response
		switch req.Op {
		case "status":
			resp = s.state()
		case "signal":
			resp = s.state()
			if resp.Running {
				// Refused (os.ErrProcessDone) once the process was reaped,
				// even while its exit is still being recorded.
				if err := s.group.Signal(syscall.Signal(req.Signal)); err != nil {
					resp.Error = err.Error()
				}
			}
		case "stop":
			resp = s.state()
			if resp.Running {
				if req.KillAfterMs > 0 {
					s.killAfter(time.Duration(req.KillAfterMs) * time.Millisecond)
				}
				if req.Signal != 0 {
					if err := s.group.Signal(syscall.Signal(req.Signal)); err != nil {
						resp.Error = err.Error()
					}
				}
			}
		case "wait":
			<-s.exited
			resp = s.state()
		case "attach":
			// The connection becomes an attach stream.
			s.attach(c, br, req)
			return
		case "reopen":
			resp = s.state()
			if err := s.log.Reopen(); err != nil {
				resp.Error = err.Error()
			}
		default:
			resp = Response{Error: fmt.Sprintf("unknown op %q", req.Op)}
		}
		if err := enc.Encode(resp); err != nil {
			return
		}
	}
}

// killAfter SIGKILLs the workload's group after d unless it exited first;
// it replaces an earlier deadline.
func (s *server) killAfter(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exit != nil {
		return
	}
	if s.kill != nil {
		s.kill.Stop()
	}
	s.kill = time.AfterFunc(d, func() {
		// Refused once the group was reaped: never another process.
		_ = s.group.Signal(syscall.SIGKILL)
	})
}

// writeExit stores the exit status durably.
func writeExit(dir string, es *ExitStatus) error {
	b, err := json.Marshal(es)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, ExitFile), b, 0o600)
}

// ReadExit returns the exit status recorded in dir, or an error wrapping
// os.ErrNotExist when the shim has recorded none.
func ReadExit(dir string) (*ExitStatus, error) {
	b, err := os.ReadFile(filepath.Join(dir, ExitFile))
	if err != nil {
		return nil, err
	}
	var es ExitStatus
	if err := json.Unmarshal(b, &es); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ExitFile), err)
	}
	return &es, nil
}
