//go:build darwin

package daemon

import "golang.org/x/sys/unix"

// memTotal reads hw.memsize.
func memTotal() uint64 {
	v, err := unix.SysctlUint64("hw.memsize")
	if err != nil {
		return 0
	}
	return v
}
