//go:build !linux

package sandbox

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"syscall"

	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
)

// Arguments of the shim binary's sandbox modes (Linux only).
const (
	InitArg  = "init"
	EnterArg = "enter"
	ExecArg  = "exec"
)

var errLinuxOnly = errors.New("the namespace sandbox is Linux-only (darwin's boundary is Seatbelt, see WrapArgv)")

// Available reports whether the namespace sandbox can be used: never here.
func Available() bool { return false }

// Rootless is false: there is no namespace sandbox here.
func Rootless() bool { return false }

// Start is Linux-only.
func Start(spec *Spec, ms []mounts.Mount, stage, scratch string, cgroups []string, joinCgroups bool, argv, env []string, dir string, stdin, stdout, stderr *os.File, attrs *syscall.SysProcAttr) (*exec.Cmd, error) {
	return nil, errLinuxOnly
}

// BornInCgroup is false: Start starts nothing here.
func BornInCgroup(cmd *exec.Cmd) bool { return false }

// EnterArgv is argv itself: there are no namespaces to enter.
func EnterArgv(shim, attemptDir, dir string, argv []string) []string { return argv }

// InitMain, EnterMain and ExecMain are Linux-only.
func InitMain() int               { return 126 }
func EnterMain(args []string) int { return 126 }
func ExecMain(args []string) int  { return 126 }

// Arguments of the shim binary's pod-namespace modes (Linux only).
const (
	HoldArg = "hold"
	DialArg = "dial"
)

// HoldMain and DialMain are Linux-only.
func HoldMain() int              { return 126 }
func DialMain(args []string) int { return 126 }

// DialIn is Linux-only: pods have no network namespace elsewhere.
func DialIn(ctx context.Context, shim, userns, netns, network, addr string) (net.Conn, error) {
	return nil, errLinuxOnly
}

// EnterPodArgv is Linux-only.
func EnterPodArgv(userns, netns string, argv []string) ([]string, error) { return nil, errLinuxOnly }

// PodNamespaces is Linux-only.
type PodNamespaces struct{ Pid int }

// Close does nothing here.
func (h *PodNamespaces) Close() error { return nil }

// NewPodNamespaces is Linux-only.
func NewPodNamespaces(shim string) (*PodNamespaces, error) { return nil, errLinuxOnly }
