//go:build !linux && !darwin

package dataplane

import (
	"fmt"
	"runtime"
)

// New refuses: the pod network needs network namespaces (Linux) or lo0
// aliases and pf (darwin).
func New(Options) (Dataplane, error) {
	return nil, fmt.Errorf("dataplane: the k3sm pod network is supported on Linux and darwin only, not %s", runtime.GOOS)
}
