// Package vm owns the machine that hosts klimax's Docker engine: a Driver
// hides whether that is a Lima VZ virtual machine (driven through limactl on
// macOS) or the local Linux host itself, and runs guest commands with
// timeouts and cancellation.
package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// DefaultTimeout bounds a guest command whose RunOptions set no Timeout.
const DefaultTimeout = 10 * time.Minute

// Phase is the lifecycle state of the machine.
type Phase string

const (
	PhaseAbsent  Phase = "Absent"  // never created (or deleted)
	PhaseStopped Phase = "Stopped" // exists, not running
	PhaseRunning Phase = "Running"
	PhaseBroken  Phase = "Broken" // exists but the provider reports an error
)

// State describes the machine as the provider sees it.
type State struct {
	Name   string `json:"name"`
	Driver string `json:"driver"`
	Phase  Phase  `json:"phase"`
	// Detail is provider specific (e.g. Lima's instance dir, CPUs, memory).
	Detail string `json:"detail,omitempty"`
}

// RunOptions tune one guest command.
type RunOptions struct {
	// Timeout bounds the command; 0 means DefaultTimeout, <0 means none
	// (the context still cancels it).
	Timeout time.Duration
	// Root runs the command as root in the guest (sudo when needed).
	Root bool
	// Stdin is fed to the command (e.g. a script for `bash -s`).
	Stdin io.Reader
	// Stdout/Stderr, when set, receive output as it is produced; it is
	// captured in Result as well.
	Stdout, Stderr io.Writer
}

// Result is what a finished guest command produced.
type Result struct {
	Stdout   []byte
	Stderr   []byte
	ExitCode int
}

// ExitError is returned when a guest command ran but failed.
type ExitError struct {
	Argv     []string
	ExitCode int
	Stderr   string
}

func (e *ExitError) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if len(msg) > 2000 {
		msg = "..." + msg[len(msg)-2000:]
	}
	return fmt.Sprintf("%s: exit status %d: %s", strings.Join(e.Argv, " "), e.ExitCode, msg)
}

// ErrTimeout is wrapped by Run when a command exceeded its Timeout.
var ErrTimeout = errors.New("command timed out")

// Runner runs commands inside the machine.
type Runner interface {
	Run(ctx context.Context, argv []string, opts RunOptions) (Result, error)
}

// IO is the terminal an interactive shell is attached to.
type IO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Driver is one way to provide the machine that runs Docker, kind and the
// clusters. Every method is idempotent.
type Driver interface {
	Runner
	// Name is the driver name as configured (lima, host).
	Name() string
	// Ensure creates the machine if absent and starts it if stopped; it does
	// nothing when the machine already runs. It reports whether it changed
	// anything.
	Ensure(ctx context.Context) (changed bool, err error)
	// Start starts an existing machine.
	Start(ctx context.Context) error
	// Stop stops the machine if it runs.
	Stop(ctx context.Context) error
	// Delete removes the machine and its disk if it exists.
	Delete(ctx context.Context) error
	// Status reports the current state without changing anything.
	Status(ctx context.Context) (State, error)
	// Shell starts an interactive shell (or runs args) attached to io.
	Shell(ctx context.Context, args []string, io IO) error
	// HostAddress is the guest address the host uses to reach the kind
	// bridge (route gateway, API server address in kubeconfigs): the VM's
	// lima0 address, read at run time; the loopback address on host.
	HostAddress(ctx context.Context) (netip.Addr, error)
	// NeedsRoute reports whether the host needs a route to the kind bridge
	// via HostAddress (true for a VM, false when the bridge is local).
	NeedsRoute() bool
	// DockerHost is the DOCKER_HOST value that reaches the machine's engine
	// from the host ("" means the client's default environment).
	DockerHost() string
}

// execCommand runs argv locally with the timeout/cancellation rules of
// RunOptions. On timeout or cancellation the process group gets SIGTERM,
// then SIGKILL after a grace period.
func execCommand(ctx context.Context, argv []string, env []string, opts RunOptions) (Result, error) {
	if len(argv) == 0 {
		return Result{}, errors.New("empty command")
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if env != nil {
		cmd.Env = env
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if opts.Stdout != nil {
		cmd.Stdout = io.MultiWriter(&stdout, opts.Stdout)
	}
	if opts.Stderr != nil {
		cmd.Stderr = io.MultiWriter(&stderr, opts.Stderr)
	}
	cmd.Stdin = opts.Stdin
	err := cmd.Run()
	res := Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	if err == nil {
		return res, nil
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) && timeout > 0 {
			return res, fmt.Errorf("%s: %w after %s", strings.Join(argv, " "), ErrTimeout, timeout)
		}
		return res, fmt.Errorf("%s: %w", strings.Join(argv, " "), cerr)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return res, &ExitError{Argv: argv, ExitCode: res.ExitCode, Stderr: stderr.String()}
	}
	return res, fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
}

// interactive runs argv attached to the given terminal.
func interactive(ctx context.Context, argv []string, tio IO) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tio.Stdin, tio.Stdout, tio.Stderr
	if cmd.Stdin == nil {
		cmd.Stdin = os.Stdin
	}
	if cmd.Stdout == nil {
		cmd.Stdout = os.Stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	return cmd.Run()
}
