package pod

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// ProcessSpec is everything needed to start one container attempt. Paths
// are absolute host paths: resolution inside the pod root already happened.
type ProcessSpec struct {
	// ID names the attempt uniquely and stably (used for the shim socket).
	ID      string
	Argv    []string
	Env     []string
	Dir     string
	LogPath string
	// LogMaxSize and LogMaxFiles rotate the log (0: never).
	LogMaxSize  int64
	LogMaxFiles int
	// StateDir is a directory private to this attempt where the starter may
	// keep its files (the shim's config, exit status, socket).
	StateDir string
	// Stdin keeps the container's stdin open for attach (`stdin: true`);
	// StdinOnce closes it when the first attached client leaves.
	Stdin, StdinOnce bool
	// TTY runs the container on a pseudo-terminal (`tty: true`).
	TTY bool
	// Mounts are the container's volumes, in the order to mount them
	// (parents before children). With any, the process gets a mount
	// namespace of its own (see package mounts).
	Mounts []mounts.Mount
	// NetNS is the pod's network namespace (a bound nsfs file) the
	// process starts in; empty: the node's network.
	NetNS string
	// UserNS owns NetNS when the runtime is not root: the shim runs in
	// both (sandbox.EnterPodArgv). Without a pod network, a rootless
	// debug container's shim runs in its target's (NetNS empty).
	UserNS string
	// Sandbox is the container's boundary (nil: none, as on a node
	// without one). See package sandbox.
	Sandbox *sandbox.Spec
	// Cgroups are the container's cgroup directories (one per
	// hierarchy; empty: not placed in a cgroup).
	Cgroups []string
}

// Starter starts container processes. It is the single seam through which
// every workload process is created, so the sandbox (an exec shim applying
// Landlock+seccomp / Seatbelt to itself) and the per-pod network namespace
// can wrap process start later without touching the lifecycle code.
type Starter interface {
	// Start launches the attempt and returns once it runs (or failed to).
	// A start failure the workload caused (no such executable, exec format
	// error) is a *StartError.
	Start(ctx context.Context, spec ProcessSpec) (Process, error)
	// Attach reconnects to the attempt recorded in stateDir after a daemon
	// restart. It always returns a Process (running reports whether its
	// shim answered): for an attempt that already ended, Wait returns its
	// recorded status at once. An attempt whose process provably never
	// started (the daemon died before its shim was spawned, or the shim
	// died before it started the process) is an error wrapping
	// ErrNotStarted: starting it again is not a restart.
	Attach(stateDir string) (proc Process, running bool, err error)
}

// ErrNotStarted: the attempt in a state directory never started its
// process (see Starter.Attach).
var ErrNotStarted = errors.New("the attempt never started its process")

// Process is a started container attempt.
type Process interface {
	Pid() int
	StartedAt() time.Time
	// Signal delivers sig to the container's whole process group.
	Signal(sig syscall.Signal) error
	// Wait blocks until the process ended (or ctx is done).
	Wait(ctx context.Context) (ExitStatus, error)
}

// ExitStatus is how an attempt ended.
type ExitStatus struct {
	ExitCode   int
	Signal     int
	StartedAt  time.Time
	FinishedAt time.Time
	// Unknown is set when the shim died without recording a status.
	Unknown bool
	// Message explains a start failure or an unknown status.
	Message string
}

// Stopper is implemented by a Process whose supervisor can hold the kill
// deadline of a stop: Stop sends sig (none when 0) and SIGKILLs the group
// after killAfter unless it exited, even if the daemon is gone by then.
type Stopper interface {
	Stop(sig syscall.Signal, killAfter time.Duration) error
}

// Attachable is implemented by a Process whose stdio a client can attach to
// (kubectl attach): output from now on, and stdin when the container keeps
// it open.
type Attachable interface {
	AttachStdio(ctx context.Context, stdin bool) (StdioConn, error)
}

// StdioConn is one attach session. Recv returns output until the container
// exits (then exit is set, and the session is over) or the session breaks.
type StdioConn interface {
	Recv() (stdout, stderr []byte, exit *ExitStatus, err error)
	SendStdin(p []byte) error
	CloseStdin() error
	Resize(width, height uint16) error
	Close() error
}

// StartError is a workload start failure (reported as StartError, exit 128).
type StartError struct{ Msg string }

func (e *StartError) Error() string { return e.Msg }
