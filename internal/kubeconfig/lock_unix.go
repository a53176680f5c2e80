//go:build unix

package kubeconfig

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive advisory lock so concurrent klimax/k3sm
// processes do not interleave read-modify-write cycles on one kubeconfig.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
