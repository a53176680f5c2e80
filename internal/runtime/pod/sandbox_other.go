//go:build !linux && !darwin

package pod

import "github.com/k3sm-dev/k3sm/internal/runtime/sandbox"

// sandboxed: there is no sandbox here.
func sandboxed() bool { return false }

// buildSandbox: none here (a documented fallback: pods run as the daemon's
// user with the host's view).
func buildSandbox(in sandboxInput) (*sandbox.Spec, error) { return nil, nil }

func (p *managedPod) idRangeBase() (uint32, error) { return 0, nil }

const nativeRoot = ""

// wrapperSandbox: the boundary here is not a wrapper process.
func wrapperSandbox(in sandboxInput) (*sandbox.Spec, error) { return nil, nil }

// slotBase: pods have no id range here.
func slotBase(n int32) uint32 { return 0 }
