package pod

import (
	"context"
	"syscall"
	"time"
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
	// StateDir is a directory private to this attempt where the starter may
	// keep its files (the shim's config, exit status, socket).
	StateDir string
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
	// recorded status at once.
	Attach(stateDir string) (proc Process, running bool, err error)
}

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

// StartError is a workload start failure (reported as StartError, exit 128).
type StartError struct{ Msg string }

func (e *StartError) Error() string { return e.Msg }
