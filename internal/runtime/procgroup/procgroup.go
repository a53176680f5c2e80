// Package procgroup signals a child's process group (or session) without
// the pid-reuse race of kill(-pgid) after the leader was reaped.
//
// A process group's id is its leader's pid. Once the leader is reaped and
// the group is empty, that number is free and the next fork may get it:
// kill(-pgid) then reaches an unrelated process. A Group therefore waits for
// its leader without reaping it (Linux: waitid with WNOWAIT), kills what is
// left of the group while the zombie leader still holds the number, and only
// then reaps; after that every Signal is a no-op returning
// os.ErrProcessDone.
//
// It links only the standard library and golang.org/x/sys: the shim uses
// it.
package procgroup

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"syscall"
)

// WaitsWithoutReaping reports whether Group.Wait runs beforeReap after the
// leader exited (Linux); elsewhere it runs before (the exit is only known
// by reaping).
const WaitsWithoutReaping = runtime.GOOS == "linux"

// ErrFinished is returned by Signal once the leader was reaped.
var ErrFinished = os.ErrProcessDone

// Group is a child process that leads its own process group (Setpgid) or
// session (Setsid).
type Group struct {
	pid     int
	session bool

	mu       sync.Mutex
	finished bool
}

// New guards the group led by pid, a child of this process. With session
// the leader also leads its own session, whose other groups (a shell's
// background jobs) are killed with it when it exits.
func New(pid int, session bool) *Group { return &Group{pid: pid, session: session} }

// Pid is the leader's pid (the group id).
func (g *Group) Pid() int { return g.pid }

// Signal sends sig to every process of the group. Once the leader was
// reaped (Wait is past its exit) it sends nothing and returns ErrFinished:
// the number may belong to someone else by now.
func (g *Group) Signal(sig syscall.Signal) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.finished {
		return ErrFinished
	}
	err := syscall.Kill(-g.pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// Wait waits for the leader to exit, SIGKILLs the rest of its group (and
// session) while the unreaped leader still holds the group's number, calls
// beforeReap (may be nil; e.g. draining pipes the group held), and then
// reap, which must reap the leader (exec.Cmd.Wait). It returns reap's
// error.
func (g *Group) Wait(beforeReap func(), reap func() error) error {
	if err := waitExited(g.pid); err != nil {
		// No wait without reaping here (or it failed): reap first, then
		// kill the rest as soon as possible. Another process may get the
		// number in between; that window is what Linux avoids.
		if beforeReap != nil {
			beforeReap()
		}
		rerr := reap()
		g.mu.Lock()
		g.finished = true
		syscall.Kill(-g.pid, syscall.SIGKILL)
		g.mu.Unlock()
		return rerr
	}
	g.mu.Lock()
	syscall.Kill(-g.pid, syscall.SIGKILL)
	if g.session {
		killSession(g.pid)
	}
	g.finished = true
	g.mu.Unlock()
	if beforeReap != nil {
		beforeReap()
	}
	return reap()
}
