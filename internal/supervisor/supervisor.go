// Package supervisor owns the lifecycle of the server's child processes: it
// starts each Component, waits for it to become ready, restarts it with capped
// backoff when it dies, sends its output to its own log file, and stops every
// child (in reverse start order) so that none is left behind.
//
// How a component runs is decided here, in one place: every component is a
// child process. Children learn that their supervisor died through a pipe (see
// WatchParent), which works on every OS, so a kill -9 of the supervisor leaves
// no orphan holding ports or the datastore.
package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/backoff"
	"gopkg.in/natefinch/lumberjack.v2"
)

// Component is one supervised piece of the server.
type Component interface {
	// Name is the component's short name; it names its log file.
	Name() string
	// Command returns the child's command line. Dir and Env may be empty.
	Command() Command
	// Ready returns nil once the running child serves; it is called
	// repeatedly until it succeeds or ctx ends.
	Ready(ctx context.Context) error
}

// Command is how a child is started.
type Command struct {
	Path string
	Args []string
	Env  []string // appended to the supervisor's environment
	Dir  string
	// Settle tells the process, through a pipe of its own (SettleFDEnv),
	// once the supervisor has settled (Supervisor.Settle, when the whole
	// server is up) and the process is ready; a restarted process is told
	// when it is ready again. A pipe, not a signal: a signal can reach a
	// process before its runtime has a handler (a node judged ready by the
	// Node object an earlier process left Ready) and kill it.
	Settle bool
}

// DefaultBackoff is the delay between restarts of a crashing child: it
// restarts quickly first (a killed apiserver should come back within a
// second) and caps the delay so a broken child does not spin.
var DefaultBackoff = backoff.Backoff{Initial: 250 * time.Millisecond, Max: 30 * time.Second}

// DefaultBackoffReset is how long a child must run before its restart
// delay returns to Initial.
const DefaultBackoffReset = time.Minute

// RestartMaxDelayEnv sets another Backoff.Max (a Go duration, at least
// Initial), e.g. for a test or a drill that kills a component many times
// in a row and should not wait 30 s for each restart.
const RestartMaxDelayEnv = "K3SM_RESTART_MAX_DELAY"

// backoffFromEnv is DefaultBackoff with RestartMaxDelayEnv applied.
func backoffFromEnv() (backoff.Backoff, error) {
	b := DefaultBackoff
	v := os.Getenv(RestartMaxDelayEnv)
	if v == "" {
		return b, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < b.Initial {
		return b, fmt.Errorf("%s=%q: want a duration of at least %s (e.g. 5s), or unset it for the default %s",
			RestartMaxDelayEnv, v, b.Initial, DefaultBackoff.Max)
	}
	b.Max = d
	return b, nil
}

// ParentFDEnv tells a child which inherited descriptor is its parent-death pipe.
const ParentFDEnv = "K3SM_PARENT_FD"

// SettleFDEnv tells a Command.Settle child which inherited descriptor is
// its settle pipe: a byte arrives on it when start-up is over (OnSettled).
const SettleFDEnv = "K3SM_SETTLE_FD"

// Supervisor runs children.
type Supervisor struct {
	LogDir string
	Log    *slog.Logger
	// Backoff is the delay between restarts of a crashing child; each
	// child steps a copy of its own (Initial and Max), from Initial.
	Backoff backoff.Backoff
	// BackoffReset is how long a child must run before its delay returns
	// to Backoff.Initial.
	BackoffReset time.Duration
	StopTimeout  time.Duration
	// LogMaxSizeMB and LogMaxBackups rotate each child's log (lumberjack:
	// <name>.log is renamed <name>-<time>.log.gz at the size, the oldest
	// beyond the count removed). Set before Start.
	LogMaxSizeMB  int
	LogMaxBackups int
	// StateFile, when set before Start, is rewritten (atomically) whenever
	// a child starts, passes its readiness check or exits: how `k3sm
	// status` learns the supervisor's view of its children.
	StateFile string

	stateMu  sync.Mutex // serializes writes of StateFile
	mu       sync.Mutex
	children []*Child
	pipeR    *os.File
	pipeW    *os.File
	settled  bool // Settle was called
}

// New returns a supervisor writing child logs under logDir.
func New(logDir string, log *slog.Logger) (*Supervisor, error) {
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return nil, err
	}
	b, err := backoffFromEnv()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	return &Supervisor{LogDir: logDir, Log: log, Backoff: b, BackoffReset: DefaultBackoffReset, StopTimeout: 15 * time.Second, pipeR: r, pipeW: w,
		LogMaxSizeMB: DefaultLogMaxSizeMB, LogMaxBackups: DefaultLogMaxBackups}, nil
}

// Component logs rotate at 50 MB, 3 compressed backups kept.
const (
	DefaultLogMaxSizeMB  = 50
	DefaultLogMaxBackups = 3
)

// Child is a running, supervised component.
type Child struct {
	c         Component
	s         *Supervisor
	ctx       context.Context // Start's: ends readiness probing
	ready     chan struct{}
	readyOnce sync.Once
	logw      *lumberjack.Logger // the child's log, across its restarts

	mu       sync.Mutex
	cmd      *exec.Cmd
	settle   bool     // cmd's Command.Settle
	settleW  *os.File // write end of cmd's settle pipe, until written
	live     bool     // cmd passed Ready
	stopping bool
	restarts int
	started  time.Time     // of the current process
	lastExit string        // how the previous process ended, "" if none did
	done     chan struct{} // closed when the supervise loop ends
	stopCh   chan struct{} // closed by Stop
	exited   chan struct{} // replaced on every start; closed when that process exits
}

// Start launches c and keeps it running until Stop. It returns once the first
// process has been started; use WaitReady to wait for health.
func (s *Supervisor) Start(ctx context.Context, c Component) (*Child, error) {
	ch := &Child{c: c, s: s, ctx: ctx, ready: make(chan struct{}), done: make(chan struct{}), stopCh: make(chan struct{})}
	ch.logw = &lumberjack.Logger{Filename: ch.LogPath(), MaxSize: max(s.LogMaxSizeMB, 1), MaxBackups: s.LogMaxBackups, Compress: true}
	if err := ch.spawn(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.children = append(s.children, ch)
	s.mu.Unlock()
	go ch.supervise()
	s.writeState()
	return ch, nil
}

// ChildState is one child as the supervisor sees it.
type ChildState struct {
	Name string `json:"name"`
	Pid  int    `json:"pid"`
	// Live: the current process passed its readiness check.
	Live     bool      `json:"live"`
	Restarts int       `json:"restarts"`
	Started  time.Time `json:"started"`
	LastExit string    `json:"lastExit,omitempty"`
	Stopping bool      `json:"stopping,omitempty"`
}

// State is what StateFile holds.
type State struct {
	Pid      int          `json:"pid"` // the supervisor's
	Updated  time.Time    `json:"updated"`
	Children []ChildState `json:"children"`
}

// State returns the children in start order.
func (s *Supervisor) State() State {
	s.mu.Lock()
	children := slices.Clone(s.children)
	s.mu.Unlock()
	st := State{Pid: os.Getpid(), Updated: time.Now().UTC(), Children: []ChildState{}}
	for _, ch := range children {
		ch.mu.Lock()
		cs := ChildState{Name: ch.c.Name(), Live: ch.live, Restarts: ch.restarts, Started: ch.started, LastExit: ch.lastExit, Stopping: ch.stopping}
		if ch.cmd != nil && ch.cmd.Process != nil {
			cs.Pid = ch.cmd.Process.Pid
		}
		select {
		case <-ch.exited:
			cs.Pid, cs.Live = 0, false // between exit and restart
		default:
		}
		ch.mu.Unlock()
		st.Children = append(st.Children, cs)
	}
	return st
}

// ReadState reads a StateFile.
func ReadState(path string) (State, error) {
	var st State
	data, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(data, &st)
}

// writeState rewrites StateFile; no lock of a child may be held. A failed
// write only makes `k3sm status` less precise, so it is logged, not fatal.
func (s *Supervisor) writeState() {
	if s.StateFile == "" {
		return
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	data, err := json.MarshalIndent(s.State(), "", "  ")
	if err == nil {
		err = atomicfile.WriteFile(s.StateFile, append(data, '\n'), 0o644)
	}
	if err != nil {
		s.Log.Warn("cannot write the supervisor state file", "file", s.StateFile, "err", err)
	}
}

// Name returns the component name.
func (ch *Child) Name() string { return ch.c.Name() }

// Pid returns the current process id, or 0.
func (ch *Child) Pid() int {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.cmd == nil || ch.cmd.Process == nil {
		return 0
	}
	return ch.cmd.Process.Pid
}

// Restarts returns how often the child was restarted after dying.
func (ch *Child) Restarts() int {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.restarts
}

// LogPath is the file the child's output goes to.
func (ch *Child) LogPath() string { return filepath.Join(ch.s.LogDir, ch.c.Name()+".log") }

// WaitReady blocks until the component first reports ready, or returns an
// error that includes the tail of its log when ctx ends first.
func (ch *Child) WaitReady(ctx context.Context) error {
	select {
	case <-ch.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s did not become ready: %w; last lines of %s:\n%s", ch.c.Name(), context.Cause(ctx), ch.LogPath(), Tail(ch.LogPath(), 15))
	}
}

// probeReady polls one process's readiness: the first success of any
// process marks the child ready, and a Settle child is told it settled once
// the supervisor has.
func (ch *Child) probeReady(cmd *exec.Cmd, exited <-chan struct{}) {
	ctx, cancel := context.WithCancel(ch.ctx)
	defer cancel()
	go func() {
		select {
		case <-exited:
		case <-ch.stopCh:
		case <-ctx.Done():
		}
		cancel()
	}()
	t := time.NewTicker(25 * time.Millisecond)
	defer t.Stop()
	for {
		if err := ch.c.Ready(ctx); err == nil {
			ch.readyOnce.Do(func() { close(ch.ready) })
			ch.s.mu.Lock()
			settled := ch.s.settled
			ch.s.mu.Unlock()
			ch.mu.Lock()
			if ch.cmd == cmd {
				ch.live = true
				if settled {
					ch.signalSettled()
				}
			}
			ch.mu.Unlock()
			ch.s.writeState()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// signalSettled tells the current process it settled; ch.mu is held.
func (ch *Child) signalSettled() {
	if !ch.settle || !ch.live || ch.cmd == nil || ch.settleW == nil {
		return
	}
	// One byte in an empty pipe never blocks; a process gone meanwhile
	// makes it fail harmlessly (EPIPE: Go ignores SIGPIPE on other fds).
	_, _ = ch.settleW.Write([]byte{1})
	ch.settleW.Close()
	ch.settleW = nil
}

// Settle is called once the whole server is up: start-up is over, so every
// Settle child that is ready is told, and any that (re)starts later is told
// when it is ready. Settling earlier would slow what is still starting (the
// controller-manager starts its controllers after its health check passes).
func (s *Supervisor) Settle() {
	s.mu.Lock()
	s.settled = true
	children := slices.Clone(s.children)
	s.mu.Unlock()
	for _, ch := range children {
		ch.mu.Lock()
		ch.signalSettled()
		ch.mu.Unlock()
	}
}

func (ch *Child) spawn() error {
	spec := ch.c.Command()
	// Through a pipe to the rotating writer (a file the child held would
	// grow forever). The same writer for both: exec copies with one
	// goroutine at a time.
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Dir = spec.Dir
	cmd.Stdout, cmd.Stderr = ch.logw, ch.logw
	// A descendant keeping the pipe open must not hold up Wait.
	cmd.WaitDelay = 2 * time.Second
	cmd.Env = append(append(os.Environ(), spec.Env...), ParentFDEnv+"=3")
	cmd.ExtraFiles = []*os.File{ch.s.pipeR}
	var settleR, settleW *os.File
	if spec.Settle {
		var err error
		if settleR, settleW, err = os.Pipe(); err != nil {
			return fmt.Errorf("%s: settle pipe: %w", ch.c.Name(), err)
		}
		defer settleR.Close() // the child's end, once it has it
		cmd.ExtraFiles = append(cmd.ExtraFiles, settleR)
		cmd.Env = append(cmd.Env, SettleFDEnv+"=4")
	}
	// Own process group: a terminal's Ctrl-C reaches only the supervisor,
	// which then stops the children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		if settleW != nil {
			settleW.Close()
		}
		return fmt.Errorf("%s: start: %w", ch.c.Name(), err)
	}
	exited := make(chan struct{})
	ch.mu.Lock()
	if ch.settleW != nil {
		ch.settleW.Close() // the previous process's, never written
	}
	ch.cmd, ch.exited, ch.settle, ch.settleW, ch.live, ch.started = cmd, exited, spec.Settle, settleW, false, time.Now().UTC()
	stopping := ch.stopping
	ch.mu.Unlock()
	if stopping {
		// Stop ran while this process was being started: it must not survive.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	go ch.probeReady(cmd, exited)
	return nil
}

// sleep waits d or until Stop; it reports whether the child is stopping.
func (ch *Child) sleep(d time.Duration) bool {
	select {
	case <-ch.stopCh:
		return true
	case <-time.After(d):
		return false
	}
}

func (ch *Child) supervise() {
	defer close(ch.done)
	defer ch.logw.Close()
	delay := backoff.Backoff{Initial: ch.s.Backoff.Initial, Max: ch.s.Backoff.Max} // this child's, from Initial
	for {
		ch.mu.Lock()
		cmd, exited := ch.cmd, ch.exited
		ch.mu.Unlock()
		started := time.Now()
		err := cmd.Wait()
		close(exited)
		ch.mu.Lock()
		stopping := ch.stopping
		ch.live, ch.lastExit = false, exitReason(err)
		if ch.settleW != nil {
			ch.settleW.Close()
			ch.settleW = nil
		}
		ch.mu.Unlock()
		if stopping {
			return
		}
		ch.s.writeState()
		ran := time.Since(started)
		if ran > ch.s.BackoffReset {
			delay.Reset()
		}
		d := delay.Next()
		ch.s.Log.Warn("component exited; restarting", "component", ch.c.Name(), "pid", cmd.Process.Pid,
			"status", exitReason(err), "ran", ran.Round(time.Millisecond).String(), "restartIn", d.String(), "log", ch.LogPath())
		if ch.sleep(d) {
			return
		}
		for {
			err := ch.spawn()
			if err == nil {
				break
			}
			d := delay.Next()
			ch.s.Log.Error("restart failed", "component", ch.c.Name(), "err", err, "retryIn", d.String())
			if ch.sleep(d) {
				return
			}
		}
		ch.mu.Lock()
		ch.restarts++
		ch.mu.Unlock()
		ch.s.writeState()
	}
}

// Stop terminates the child: SIGTERM to its process group, then SIGKILL after
// timeout. It returns when the process is gone.
func (ch *Child) Stop(timeout time.Duration) {
	ch.mu.Lock()
	if ch.stopping {
		ch.mu.Unlock()
		<-ch.done
		return
	}
	ch.stopping = true
	close(ch.stopCh)
	cmd, exited := ch.cmd, ch.exited
	ch.mu.Unlock()
	pgid := cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(timeout):
		ch.s.Log.Warn("component did not stop in time; killing", "component", ch.c.Name(), "timeout", timeout.String())
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-exited
	}
	// Anything the child left in its group goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-ch.done
}

// StopAll stops every child in reverse start order.
func (s *Supervisor) StopAll() {
	s.mu.Lock()
	children := append([]*Child(nil), s.children...)
	s.children = nil
	s.mu.Unlock()
	for i := len(children) - 1; i >= 0; i-- {
		children[i].Stop(s.StopTimeout)
		s.Log.Info("stopped", "component", children[i].Name())
	}
}

func exitReason(err error) string {
	if err == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by signal " + ws.Signal().String()
		}
	}
	return err.Error()
}

// Tail returns up to n last lines of the file at path.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	const window = 16 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		_, _ = f.Seek(st.Size()-window, io.SeekStart)
	}
	data, _ := io.ReadAll(f)
	lines := 0
	for i := len(data) - 1; i >= 0; i-- {
		if data[i] == '\n' && i != len(data)-1 {
			lines++
			if lines == n {
				return string(data[i+1:])
			}
		}
	}
	return string(data)
}

// WatchParent is called by a child role at start: when the supervisor dies
// (its end of the pipe closes) the child runs onParentGone, which should exit.
// It returns false when the process was not started by a supervisor.
func WatchParent(onParentGone func()) bool {
	if os.Getenv(ParentFDEnv) != "3" {
		return false
	}
	os.Unsetenv(ParentFDEnv)
	// The descriptor must not leak into processes this child starts.
	syscall.CloseOnExec(3)
	f := os.NewFile(3, "parent-pipe")
	go func() {
		var b [1]byte
		for {
			if _, err := f.Read(b[:]); err != nil {
				onParentGone()
				return
			}
		}
	}()
	return true
}

// RunAsChild makes a supervised child exit as soon as its supervisor is
// gone, and settle when told (OnSettled); every hidden role calls it first.
func RunAsChild() {
	OnSettled()
	WatchParent(func() {
		fmt.Fprintln(os.Stderr, "k3sm: supervisor exited; stopping")
		os.Exit(1)
	})
}
