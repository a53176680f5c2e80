//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Landlock filesystem rights, by the ABI that introduced them.
const (
	llExec    = unix.LANDLOCK_ACCESS_FS_EXECUTE
	llWrite   = unix.LANDLOCK_ACCESS_FS_WRITE_FILE
	llRead    = unix.LANDLOCK_ACCESS_FS_READ_FILE
	llReadDir = unix.LANDLOCK_ACCESS_FS_READ_DIR
	// ABI 1: the 13 original rights.
	llABI1 = llExec | llWrite | llRead | llReadDir |
		unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE |
		unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR |
		unix.LANDLOCK_ACCESS_FS_MAKE_REG | unix.LANDLOCK_ACCESS_FS_MAKE_SOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_SYM
	llRefer    = unix.LANDLOCK_ACCESS_FS_REFER     // ABI 2
	llTruncate = unix.LANDLOCK_ACCESS_FS_TRUNCATE  // ABI 3
	llIoctlDev = unix.LANDLOCK_ACCESS_FS_IOCTL_DEV // ABI 5

	// llReadExec is what a ReadExec path grants.
	llReadExec = llExec | llRead | llReadDir
	// llReadWrite is what a ReadWrite path grants: everything but device
	// nodes (a pod never makes one; in a user namespace the kernel
	// refuses them anyway).
	llReadWrite = llReadExec | llWrite | llRefer | llTruncate | llIoctlDev |
		unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE |
		unix.LANDLOCK_ACCESS_FS_MAKE_DIR | unix.LANDLOCK_ACCESS_FS_MAKE_REG |
		unix.LANDLOCK_ACCESS_FS_MAKE_SOCK | unix.LANDLOCK_ACCESS_FS_MAKE_FIFO |
		unix.LANDLOCK_ACCESS_FS_MAKE_SYM
	// llFile are the rights that apply to a file (not a directory): the
	// kernel refuses a rule on a file with directory rights.
	llFile = llExec | llWrite | llRead | llTruncate | llIoctlDev
)

// LandlockABI is the kernel's Landlock ABI version: 0 when the kernel has
// none (ENOSYS) or it is disabled (EOPNOTSUPP, landlock not in lsm=).
func LandlockABI() int {
	abi, _ := LandlockVersion()
	return abi
}

// LandlockVersion asks the kernel for its Landlock ABI version,
// landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION); when
// it has none, 0 and the errno (ENOSYS or EOPNOTSUPP) that says why.
func LandlockVersion() (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// handledFS is every filesystem right the ABI knows. Rights of ABIs newer
// than 5 that this code does not know are not handled (stay allowed).
func handledFS(abi int) uint64 {
	h := uint64(llABI1)
	if abi >= 2 {
		h |= llRefer
	}
	if abi >= 3 {
		h |= llTruncate
	}
	if abi >= 5 {
		h |= llIoctlDev
	}
	return h
}

// ApplyLandlock restricts the calling thread, and every program it
// executes from then on, to l: ReadExec paths may be read and executed,
// ReadWrite paths also written, created in, removed from and truncated;
// every other filesystem right the kernel's ABI knows is denied everywhere
// else. It uses the best ABI the kernel has and returns its version (0: the
// kernel has no Landlock; nothing is applied and the namespaces are the
// boundary). Paths that do not exist are skipped; a path that is a file
// gets the rights that apply to files.
//
// It restricts only the calling thread (landlock_restrict_self), so the
// caller must have locked its OS thread and exec the workload right after;
// the thread stays locked to the calling goroutine, so the Go scheduler
// never reuses it. The thread needs CAP_SYS_ADMIN in its user namespace or
// no_new_privs: apply Landlock before dropping capabilities or changing
// uid. It does not set no_new_privs itself (allowPrivilegeEscalation
// defaults to true).
func ApplyLandlock(l *Landlock) (abi int, err error) {
	if l == nil {
		return 0, errors.New("sandbox: ApplyLandlock: no policy (Spec.Landlock is nil: leave the container unrestricted instead of calling ApplyLandlock)")
	}
	for i, p := range l.ReadExec {
		if !filepath.IsAbs(p) {
			return 0, fmt.Errorf("sandbox: Landlock.ReadExec[%d] %q is not absolute: give the path as the container sees it, from /", i, p)
		}
	}
	for i, p := range l.ReadWrite {
		if !filepath.IsAbs(p) {
			return 0, fmt.Errorf("sandbox: Landlock.ReadWrite[%d] %q is not absolute: give the path as the container sees it, from /", i, p)
		}
	}
	abi = LandlockABI()
	if abi <= 0 {
		return 0, nil
	}
	handled := handledFS(abi)
	attr := struct{ handledAccessFS uint64 }{handled}
	r, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return abi, fmt.Errorf("sandbox: landlock_create_ruleset (ABI %d): %w", abi, errno)
	}
	ruleset := int(r)
	defer unix.Close(ruleset)
	for _, p := range l.ReadExec {
		if err := addPathRule(ruleset, p, llReadExec&handled); err != nil {
			return abi, err
		}
	}
	for _, p := range l.ReadWrite {
		if err := addPathRule(ruleset, p, llReadWrite&handled); err != nil {
			return abi, err
		}
	}
	// Never unlocked: a restricted thread must not run other goroutines,
	// and ends with the calling goroutine.
	runtime.LockOSThread()
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, uintptr(ruleset), 0, 0); errno != 0 {
		if errno == unix.EPERM {
			return abi, fmt.Errorf("sandbox: landlock_restrict_self: %w: the thread has neither CAP_SYS_ADMIN in its user namespace nor no_new_privs; apply Landlock before dropping capabilities and uid, or set no_new_privs first", errno)
		}
		return abi, fmt.Errorf("sandbox: landlock_restrict_self: %w", errno)
	}
	return abi, nil
}

// addPathRule lets access beneath path (a file: the file rights of
// access). A path that does not exist is skipped.
func addPathRule(ruleset int, path string, access uint64) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sandbox: Landlock rule for %s: open: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("sandbox: Landlock rule for %s: stat: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		access &= llFile // never empty: every ABI handles read and execute
	}
	rule := unix.LandlockPathBeneathAttr{Allowed_access: access, Parent_fd: int32(fd)}
	if _, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(ruleset), unix.LANDLOCK_RULE_PATH_BENEATH,
		uintptr(unsafe.Pointer(&rule)), 0, 0, 0); errno != 0 {
		return fmt.Errorf("sandbox: Landlock rule for %s: landlock_add_rule: %w", path, errno)
	}
	return nil
}
