package pod

import (
	"fmt"
	"os"

	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox/seatbelt"
)

// buildSandbox returns the container's Seatbelt boundary: its generated
// profile, which the shim (and exec, probes and hooks, through
// sandbox.WrapArgv) runs the process under.
func buildSandbox(in sandboxInput) (*sandbox.Spec, error) {
	groups, err := os.Getgroups()
	if err != nil {
		return nil, fmt.Errorf("sandbox: the daemon's groups: %w", err)
	}
	p, err := seatbeltPod(in, daemonIdentity{UID: os.Getuid(), GID: os.Getgid(), Groups: groups})
	if err != nil {
		return nil, err
	}
	profile, err := seatbelt.Profile(p)
	if err != nil {
		return nil, err
	}
	// The profile is the whole boundary: readOnlyRootFilesystem and
	// allowPrivilegeEscalation are rules in it, and the shim, which drops
	// the Spec once it wrapped the command, reads no other field.
	return &sandbox.Spec{Seatbelt: profile}, nil
}

// sandboxed: darwin's boundary (Seatbelt) wraps the process; the pod keeps
// the host's view of files.
func sandboxed() bool { return false }

func (p *managedPod) idRangeBase() (uint32, error) { return 0, nil }

const nativeRoot = ""

// wrapperSandbox is the container's Seatbelt boundary (the shim runs it
// under sandbox-exec; exec, probes and hooks through enter).
func wrapperSandbox(in sandboxInput) (*sandbox.Spec, error) { return buildSandbox(in) }

// slotBase: pods have no id range here.
func slotBase(n int32) uint32 { return 0 }
