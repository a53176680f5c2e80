//go:build !linux

package procgroup

import "errors"

var errUnsupported = errors.New("procgroup: waiting without reaping is not implemented on this platform")

// waitExited is Linux-only (waitid WNOWAIT); elsewhere Group.Wait reaps
// first.
func waitExited(int) error { return errUnsupported }

func killSession(int) {}

// StartTicks is 0 (unknown) on this platform.
func StartTicks(int) uint64 { return 0 }

// KillOrphanGroup cannot prove the identity of a process that is not a
// child here: it signals nothing.
func KillOrphanGroup(int, uint64) error { return errUnsupported }
