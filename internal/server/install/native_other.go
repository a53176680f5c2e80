//go:build !linux && !darwin

package install

import (
	"fmt"
	"runtime"
)

// Native is this machine's service manager: none known here.
func Native() (Service, error) {
	return nil, fmt.Errorf("k3sm install supports Linux (systemd) and macOS (launchd), not %s: run `k3sm server` under your own service manager", runtime.GOOS)
}

// CheckDataDir: nothing to check here.
func CheckDataDir(dataDir string) error { return nil }

// NativeFor is Native: the data dir does not choose the service here.
func NativeFor(dataDir string) (Service, error) { return Native() }
