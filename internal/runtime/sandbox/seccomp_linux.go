package sandbox

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MaxSeccompInsns is BPF_MAXINSNS: the kernel refuses a longer filter.
const MaxSeccompInsns = 4096

// LoadSeccomp installs filter on the calling thread only (no TSYNC: the
// caller has locked its OS thread and executes the workload next, which
// carries the filter into the new program). The kernel accepts it from a
// thread with CAP_SYS_ADMIN in its user namespace or with no_new_privs
// set. An empty filter is an error: nil Spec.Seccomp means unconfined,
// and the caller then does not call LoadSeccomp.
func LoadSeccomp(filter []SockFilter) error {
	if len(filter) == 0 {
		return errors.New("seccomp: empty filter (a nil Spec.Seccomp means unconfined: do not call LoadSeccomp)")
	}
	if len(filter) > MaxSeccompInsns {
		return fmt.Errorf("seccomp: filter has %d instructions, the kernel's limit is %d", len(filter), MaxSeccompInsns)
	}
	// SockFilter has struct sock_filter's layout; copy anyway so the
	// kernel reads a slice of exactly its type.
	prog := make([]unix.SockFilter, len(filter))
	for i, f := range filter {
		prog[i] = unix.SockFilter{Code: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	switch errno {
	case 0:
		return nil
	case unix.EACCES:
		return errors.New("seccomp: the kernel refused the filter (EACCES): the thread needs CAP_SYS_ADMIN in its user namespace or no_new_privs; load it before dropping capabilities or set no_new_privs first")
	case unix.EINVAL:
		return errors.New("seccomp: the kernel refused the filter as invalid (EINVAL): rebuild it with the seccomp package")
	}
	return fmt.Errorf("seccomp: loading the filter: %w", errno)
}
