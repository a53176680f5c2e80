// Package shimclient is the daemon's side of the resident shims: it starts
// k3sm-shim detached from the daemon (its own session, so it survives the
// daemon) and talks to it over the shim's JSON-lines unix socket. It
// implements pod.Starter.
package shimclient

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"github.com/k3sm-dev/k3sm/internal/runtime/pod"
	"github.com/k3sm-dev/k3sm/internal/runtime/podnet"
	"github.com/k3sm-dev/k3sm/internal/runtime/procgroup"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	"github.com/k3sm-dev/k3sm/internal/runtime/shim"
)

// Starter launches one k3sm-shim per container attempt.
type Starter struct {
	// ShimPath is the k3sm-shim binary.
	ShimPath string
	// SocketDir holds the shims' sockets (kept short: unix socket paths are
	// limited to ~104 bytes). It should be a 0700 directory.
	SocketDir string
	// StartTimeout bounds how long a shim may take to report start-up.
	StartTimeout time.Duration
	// JoinCgroupsAfterStart: shim.Config's, for every container (the
	// benchmark's comparison).
	JoinCgroupsAfterStart bool
}

var _ pod.Starter = (*Starter)(nil)

// socketPath derives a short, stable socket name from the attempt id.
func (s *Starter) socketPath(id string) string {
	h := sha256.Sum256([]byte(id))
	return filepath.Join(s.SocketDir, hex.EncodeToString(h[:8])+".sock")
}

// Start writes the shim config into spec.StateDir and starts the shim. With
// spec.Mounts the shim starts in a new mount namespace (see package mounts)
// and a mount that cannot be made is a *pod.StartError naming it.
func (s *Starter) Start(ctx context.Context, spec pod.ProcessSpec) (pod.Process, error) {
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		return nil, err
	}
	cfg := shim.Config{Argv: spec.Argv, Env: spec.Env, Dir: spec.Dir, LogPath: spec.LogPath,
		LogMaxSize: spec.LogMaxSize, LogMaxFiles: spec.LogMaxFiles, Socket: s.socketPath(spec.ID),
		Stdin: spec.Stdin, StdinOnce: spec.StdinOnce, TTY: spec.TTY, Mounts: spec.Mounts,
		Sandbox: spec.Sandbox, Cgroups: spec.Cgroups, JoinCgroupsAfterStart: s.JoinCgroupsAfterStart}
	if len(cfg.Socket) > 100 {
		return nil, fmt.Errorf("shim socket path %s is %d bytes, over the unix socket limit: use a shorter data dir", cfg.Socket, len(cfg.Socket))
	}
	b, _ := json.Marshal(cfg)
	// Atomically (a restarted daemon finds the shim by it), not fsynced:
	// the shim it describes cannot outlive a crash of the machine.
	if err := atomicfile.WriteFileNoSync(filepath.Join(spec.StateDir, shim.ConfigFile), b, 0o600); err != nil {
		return nil, err
	}
	os.Remove(filepath.Join(spec.StateDir, shim.ExitFile))
	logf, err := os.OpenFile(filepath.Join(spec.StateDir, shim.LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	rr, rw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer rr.Close()
	cmd := exec.Command(s.ShimPath, spec.StateDir)
	cmd.Dir = "/"
	// A shim is small: one P and an eager GC keep its heap tiny.
	cmd.Env = []string{"GOMAXPROCS=1", "GOGC=25"}
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.ExtraFiles = []*os.File{rw} // fd 3 = shim.ReadyFD
	// Own session: no signal aimed at the daemon's group or terminal reaches
	// the shim, and it outlives the daemon.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if spec.UserNS != "" {
		// The pod's own user and network namespaces (a runtime that is
		// not root): the shim is their root, with a mount namespace of
		// its own, and builds the sandbox as a root runtime's does.
		argv, err := sandbox.EnterPodArgv(spec.UserNS, spec.NetNS, cmd.Args)
		if err != nil {
			rw.Close()
			return nil, err
		}
		cmd.Path, cmd.Args = argv[0], argv
	} else if (len(spec.Mounts) > 0 || spec.Sandbox != nil) && !(spec.Sandbox != nil && sandbox.Rootless()) {
		// A mount namespace of its own (Linux), where the shim applies
		// the mounts before it starts the workload; without mounts the
		// shim shares the daemon's, as before. The rootless sandbox's
		// init mounts in its own namespaces, and its maps are written
		// from the host's user namespace, where the shim stays.
		cmd.SysProcAttr = mounts.SysProcAttr(cmd.SysProcAttr)
	}
	// In the pod's network namespace: the shim and all it starts (the
	// workload, and through nsenter exec and hooks) live in the pod's
	// network.
	netns := spec.NetNS
	if spec.UserNS != "" {
		netns = "" // entered by nsenter
	}
	if err := podnet.StartIn(netns, cmd.Start); err != nil {
		rw.Close()
		return nil, fmt.Errorf("start shim %s: %w", s.ShimPath, err)
	}
	rw.Close()
	// Tell a daemon that restarts before the shim reports (see Attach)
	// that this attempt's shim was spawned, and which process it is.
	atomicfile.WriteFileNoSync(filepath.Join(spec.StateDir, spawnFile), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
	// Reap the shim while this daemon lives; after a daemon restart the
	// shim is no longer our child and init reaps it.
	go cmd.Wait()

	timeout := s.startTimeout()
	type result struct {
		r   shim.Ready
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var r shim.Ready
		err := json.NewDecoder(rr).Decode(&r)
		ch <- result{r, err}
	}()
	var res result
	select {
	case res = <-ch:
	case <-time.After(timeout):
		cmd.Process.Kill()
		return nil, fmt.Errorf("shim for %s did not report start-up within %s", spec.ID, timeout)
	}
	if res.err != nil {
		return nil, fmt.Errorf("shim for %s exited during start-up (see %s): %w", spec.ID, filepath.Join(spec.StateDir, shim.LogFile), res.err)
	}
	if res.r.Error != "" {
		return nil, &pod.StartError{Msg: res.r.Error}
	}
	return &process{dir: spec.StateDir, socket: cfg.Socket, pid: res.r.Pid, startedAt: res.r.StartedAt, startTicks: res.r.StartTicks}, nil
}

func (s *Starter) startTimeout() time.Duration {
	if s.StartTimeout == 0 {
		return 10 * time.Second
	}
	return s.StartTimeout
}

// spawnFile records the pid of an attempt's shim once it was spawned
// (written by the daemon, not the shim).
const spawnFile = "spawn.pid"

// spawnGrace is how long Attach waits for the shim of an attempt whose
// spawn was not recorded: the daemon died between writing the config and
// recording the spawn, a window of microseconds.
const spawnGrace = time.Second

// Attach reconnects to the shim of the attempt in stateDir.
//
// The daemon may have died at any point of Start. No config: the shim was
// never spawned. A config but no answer, no pid file (written by the
// shim once its process started) and no exit file (a start failure): the
// shim is still starting (its socket answers once it ran the process), or
// it was never spawned, or it died before starting the process. Attach
// waits while the recorded shim process lives (up to the start timeout);
// then the attempt never started its process (pod.ErrNotStarted).
func (s *Starter) Attach(stateDir string) (pod.Process, bool, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, shim.ConfigFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("%w: no shim config in %s", pod.ErrNotStarted, stateDir)
	}
	if err != nil {
		return nil, false, err
	}
	var cfg shim.Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, false, err
	}
	p := &process{dir: stateDir, socket: cfg.Socket}
	start := time.Now()
	for {
		if r, err := p.call(context.Background(), shim.Request{Op: "status"}); err == nil {
			p.pid, p.startedAt, p.startTicks = r.Pid, r.StartedAt, r.StartTicks
			return p, r.Running, nil
		}
		if exists(filepath.Join(stateDir, shim.PidFile)) || exists(filepath.Join(stateDir, shim.ExitFile)) {
			break // the process started (or its start failure is recorded)
		}
		alive, recorded := shimSpawned(stateDir)
		waited := time.Since(start)
		if !recorded && waited >= spawnGrace {
			// The daemon may have died between spawning the shim and
			// recording it: a live process of this attempt is its shim.
			if pid := findShim(stateDir); pid > 0 {
				atomicfile.WriteFileNoSync(filepath.Join(stateDir, spawnFile), []byte(strconv.Itoa(pid)), 0o600)
				continue
			}
		}
		if (!recorded && waited >= spawnGrace) || (recorded && !alive) || waited >= s.startTimeout() {
			// Once more: the shim may have recorded its start just now.
			if exists(filepath.Join(stateDir, shim.PidFile)) || exists(filepath.Join(stateDir, shim.ExitFile)) {
				continue
			}
			return nil, false, fmt.Errorf("%w: its shim (%s) is gone without starting it", pod.ErrNotStarted, stateDir)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// No live shim: the attempt ended (or the shim died).
	if st, err := os.ReadFile(filepath.Join(stateDir, shim.PidFile)); err == nil {
		var r shim.Response
		if json.Unmarshal(st, &r) == nil {
			p.pid, p.startedAt, p.startTicks = r.Pid, r.StartedAt, r.StartTicks
		}
	}
	p.dead = true
	return p, false, nil
}

type process struct {
	dir       string
	socket    string
	pid       int
	startedAt time.Time
	// startTicks identifies the workload with pid (shim.Ready.StartTicks).
	startTicks uint64
	dead       bool // no shim answered at attach
}

func (p *process) Pid() int             { return p.pid }
func (p *process) StartedAt() time.Time { return p.startedAt }

// call sends one request on a new connection and reads the answer.
func (p *process) call(ctx context.Context, req shim.Request) (shim.Response, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", p.socket)
	if err != nil {
		return shim.Response{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return shim.Response{}, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return shim.Response{}, ctx.Err()
		}
		return shim.Response{}, err
	}
	var r shim.Response
	if err := json.Unmarshal(line, &r); err != nil {
		return shim.Response{}, err
	}
	if r.Error != "" {
		return r, errors.New(r.Error)
	}
	return r, nil
}

func (p *process) Signal(sig syscall.Signal) error {
	if p.dead {
		return nil
	}
	_, err := p.call(context.Background(), shim.Request{Op: "signal", Signal: int(sig)})
	if err != nil && isGone(err) {
		return nil // already exited
	}
	if err != nil && err.Error() == os.ErrProcessDone.Error() {
		// The shim reaped the process and refused to signal its number.
		return os.ErrProcessDone
	}
	return err
}

// Stop sends sig (none when 0) to the container's group and has the shim
// SIGKILL the group after killAfter unless it exited: the deadline holds
// whatever happens to the daemon (pod.Stopper).
func (p *process) Stop(sig syscall.Signal, killAfter time.Duration) error {
	if p.dead {
		return nil
	}
	_, err := p.call(context.Background(), shim.Request{Op: "stop", Signal: int(sig), KillAfterMs: max(killAfter.Milliseconds(), 1)})
	if err != nil && isGone(err) {
		return nil // already exited
	}
	if err != nil && err.Error() == os.ErrProcessDone.Error() {
		return os.ErrProcessDone
	}
	return err
}

// Wait asks the shim to answer when the process ends; if the shim is gone,
// the recorded exit file answers.
func (p *process) Wait(ctx context.Context) (pod.ExitStatus, error) {
	if !p.dead {
		r, err := p.call(ctx, shim.Request{Op: "wait"})
		if err == nil && r.Exit != nil {
			return convert(r.Exit), nil
		}
		if ctx.Err() != nil {
			return pod.ExitStatus{}, ctx.Err()
		}
	}
	// The shim may be writing the file right now: give it a moment.
	for i := 0; i < 20; i++ {
		es, err := shim.ReadExit(p.dir)
		if err == nil {
			return convert(es), nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return pod.ExitStatus{}, err
		}
		if p.dead || i == 19 {
			break
		}
		select {
		case <-ctx.Done():
			return pod.ExitStatus{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	// The shim died without recording an exit: its process group is
	// orphaned and nothing holds its output any more. End it, but only if
	// pid is still the workload the shim started (its start time matches):
	// once the workload exited, init reaped it and the number may be
	// anyone's.
	p.killOrphan()
	return pod.ExitStatus{ExitCode: 255, StartedAt: p.startedAt, FinishedAt: time.Now(), Unknown: true,
		Message: "the container's shim exited without recording an exit status"}, nil
}

// KillOrphan ends the workload of a shim that died (see Wait); it signals
// nothing unless the recorded pid is provably still the workload.
func (p *process) killOrphan() {
	if p.pid <= 0 {
		return
	}
	if err := procgroup.KillOrphanGroup(p.pid, p.startTicks); err != nil && !errors.Is(err, os.ErrProcessDone) {
		fmt.Fprintf(os.Stderr, "k3sm: shim of %s died; not killing process group %d: %v\n", p.dir, p.pid, err)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// shimSpawned reports whether the shim recorded in stateDir's spawn file
// still runs (recorded: there is such a file). On Linux the process must
// still be the shim of stateDir (its command line names it): a pid may be
// reused.
func shimSpawned(stateDir string) (alive, recorded bool) {
	b, err := os.ReadFile(filepath.Join(stateDir, spawnFile))
	if err != nil {
		return false, false
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil || pid <= 0 {
		return false, true
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false, true
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
		return bytes.Contains(cmdline, []byte(stateDir)), true
	}
	return true, true
}

// findShim returns a live process whose arguments name stateDir (this
// attempt's shim, spawned but not recorded), or 0. Without /proc (darwin)
// it finds none, and the spawn file alone decides.
func findShim(stateDir string) int {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		// The whole directory: attempt 1 is a prefix of attempt 10.
		if err != nil || !(bytes.Contains(b, []byte(stateDir+"\x00")) || bytes.Contains(b, []byte(stateDir+"/"))) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if st, err := os.ReadFile(filepath.Join(filepath.Dir(f), "stat")); err == nil && bytes.Contains(st, []byte(") Z ")) {
			continue // a zombie started nothing more
		}
		return pid
	}
	return 0
}

func convert(es *shim.ExitStatus) pod.ExitStatus {
	return pod.ExitStatus{ExitCode: es.ExitCode, Signal: es.Signal, StartedAt: es.StartedAt, FinishedAt: es.FinishedAt, Message: es.Error}
}

func isGone(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, os.ErrNotExist) ||
		errors.Is(err, syscall.ENOENT) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

var _ pod.Attachable = (*process)(nil)

// AttachStdio opens an attach session on the shim: the container's output
// from now on, and its stdin when stdin is set and the container keeps it
// open.
func (p *process) AttachStdio(ctx context.Context, stdin bool) (pod.StdioConn, error) {
	if p.dead {
		return nil, errors.New("the container's shim is gone")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", p.socket)
	if err != nil {
		return nil, err
	}
	if err := json.NewEncoder(c).Encode(shim.Request{Op: "attach", Stdin: stdin}); err != nil {
		c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	line, err := br.ReadBytes('\n')
	if err != nil {
		c.Close()
		return nil, err
	}
	var r shim.Response
	if err := json.Unmarshal(line, &r); err != nil {
		c.Close()
		return nil, err
	}
	if r.Error != "" {
		c.Close()
		return nil, errors.New(r.Error)
	}
	if !r.Running {
		c.Close()
		return nil, ErrNotRunning
	}
	return &stdioConn{c: c, br: br}, nil
}

// ErrNotRunning: the container exited before the attach.
var ErrNotRunning = errors.New("the container is not running")

type stdioConn struct {
	c  net.Conn
	br *bufio.Reader
	mu sync.Mutex // serializes frame writes
}

func (s *stdioConn) Recv() (stdout, stderr []byte, exit *pod.ExitStatus, err error) {
	kind, data, err := shim.ReadFrame(s.br)
	if err != nil {
		return nil, nil, nil, err
	}
	switch kind {
	case shim.FrameStdout:
		return data, nil, nil, nil
	case shim.FrameStderr:
		return nil, data, nil, nil
	case shim.FrameExit:
		var es shim.ExitStatus
		if err := json.Unmarshal(data, &es); err != nil {
			return nil, nil, nil, err
		}
		st := convert(&es)
		return nil, nil, &st, nil
	}
	return nil, nil, nil, fmt.Errorf("attach: unexpected frame kind %d from the shim", kind)
}

func (s *stdioConn) send(kind byte, p []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return shim.WriteFrame(s.c, kind, p)
}

func (s *stdioConn) SendStdin(p []byte) error {
	for len(p) > 0 {
		n := min(len(p), shim.MaxFrame)
		if err := s.send(shim.FrameStdin, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

func (s *stdioConn) CloseStdin() error { return s.send(shim.FrameCloseStdin, nil) }

func (s *stdioConn) Resize(w, h uint16) error {
	return s.send(shim.FrameResize, []byte{byte(w >> 8), byte(w), byte(h >> 8), byte(h)})
}

func (s *stdioConn) Close() error { return s.c.Close() }
