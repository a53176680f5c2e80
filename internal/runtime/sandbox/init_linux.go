//go:build linux

package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// InitMain is the container's init: the shim re-executed with InitArg in
// the pod's new user, pid, UTS and IPC namespaces, or a target's (see
// Start). Once the
// shim built the root it takes a mount namespace of its own, mounts /proc
// for its pid namespace and a devpts instance, masks what /proc must not
// show, pivots into the root, sets the hostname and execs the workload
// through finish. It only returns on failure, having told the shim why.
func InitMain() int {
	// Everything below applies to this thread (the mount namespace, the
	// root, the Landlock domain, the seccomp filter), which then execs.
	runtime.LockOSThread()
	res := os.NewFile(resultFD, "result")
	fail := func(err error) int {
		fmt.Fprint(res, err.Error())
		return 1
	}
	buf := make([]byte, 1<<20)
	if os.Getenv(remapEnv) != "" {
		// Started before newuidmap wrote the maps: no capabilities in
		// the namespace until an exec as its root, once they exist.
		if n, _, _, _, err := unix.Recvmsg(initFD, buf, nil, 0); err != nil || n != 1 || buf[0] != 'm' {
			return 1 // the shim gave up (and said why)
		}
		os.Unsetenv(remapEnv)
		err := unix.Exec(fdPath(exeFD), os.Args, os.Environ())
		return fail(fmt.Errorf("exec the init in its mapped user namespace: %w", err))
	}
	syscall.CloseOnExec(resultFD)
	syscall.Close(exeFD)
	n, _, _, _, err := unix.Recvmsg(initFD, buf, nil, 0)
	if err != nil || n == 0 {
		return fail(fmt.Errorf("read the init's config: %v", err))
	}
	var cfg initConfig
	if err := json.Unmarshal(buf[:n], &cfg); err != nil {
		return fail(fmt.Errorf("init config: %w", err))
	}
	if cfg.Spec.Join != nil {
		syscall.CloseOnExec(userNSFD) // nsenter's, if it had it
	}
	n, rootFD, err := recvFD(initFD, buf)
	if err != nil || n == 0 {
		return 1 // the shim gave up (and said why)
	}
	syscall.Close(initFD)
	if cfg.Rootless {
		// Not root on the host: the init builds what the shim would
		// have, in a mount namespace its user namespace owns.
		fd, err := buildRootless(&cfg)
		if err != nil {
			return fail(err)
		}
		rootFD = fd
	}
	switch {
	case cfg.Stage == "":
		if err := enterHostView(); err != nil {
			return fail(err)
		}
	case rootFD < 0:
		return fail(errors.New("the shim sent no root"))
	default:
		if err := enterRoot(rootFD); err != nil {
			return fail(err)
		}
	}
	// A joined UTS namespace is the target's, named already.
	if h := cfg.Spec.Hostname; h != "" && cfg.Spec.Join == nil {
		if err := unix.Sethostname([]byte(h)); err != nil {
			return fail(fmt.Errorf("set the hostname: %w", err))
		}
	}
	return fail(finish(cfg.Spec, cfg.Argv, cfg.Env, cfg.Dir))
}

// buildRootless makes the container's root (or, for the host's view,
// mounts the volumes) as the shim does as root (prepare), from inside the
// init's user namespace, and returns the root's descriptor (-1 for the
// host's view).
func buildRootless(cfg *initConfig) (int, error) {
	for _, o := range cfg.Spec.Own {
		if err := own(o); err != nil {
			return -1, fmt.Errorf("give volume %s to fsGroup %d: %w", o.Path, o.GID, err)
		}
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return -1, fmt.Errorf("new mount namespace: %w", err)
	}
	if err := prepare(cfg.Spec, cfg.Mounts, cfg.Stage, cfg.Scratch, ""); err != nil {
		return -1, err
	}
	if cfg.Stage == "" {
		return -1, nil
	}
	return unix.Open(cfg.Stage, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// own applies o with the init's ids (the pod's root, o.GID inside the
// pod's user namespace).
func own(o Own) error {
	if o.Setgid {
		if err := os.Chown(o.Path, 0, int(o.GID)); err != nil {
			return err
		}
		return os.Chmod(o.Path, 0o777|os.ModeSetgid)
	}
	return filepath.WalkDir(o.Path, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 0, int(o.GID))
	})
}

// maskedPaths hide kernel state from a container as runc does by default;
// readOnlyPaths may be read, not written.
var (
	maskedPaths   = []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"}
	readOnlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// enterRoot gives the calling thread a mount namespace of its own, owned
// by the pod's user namespace, and pivots it into the root (rootFD).
func enterRoot(rootFD int) error {
	// Into the root first: unshare moves the working directory to the
	// new namespace's copy of its mount.
	err := unix.Fchdir(rootFD)
	unix.Close(rootFD)
	if err != nil {
		return err
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("new mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// The root as the shim built it is locked here (it came from the
	// shim's more privileged namespace) and pivot_root refuses a locked
	// new root: a recursive clone of it made here is not.
	tree, err := unix.OpenTree(unix.AT_FDCWD, ".", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("clone the container's root: %w", err)
	}
	err = unix.MoveMount(tree, "", unix.AT_FDCWD, ".", unix.MOVE_MOUNT_F_EMPTY_PATH)
	if err == nil {
		err = unix.Fchdir(tree)
	}
	unix.Close(tree)
	if err != nil {
		return fmt.Errorf("attach the container's root: %w", err)
	}
	if err := unix.Mount("proc", "proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := unix.Mount("devpts", "dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root into the container's root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	return maskProc()
}

// enterHostView gives the calling thread a mount namespace of its own
// with the host's view the shim built (an `image: native` container) and a
// /proc of the pod's pid namespace.
func enterHostView() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("new mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	return maskProc()
}

// maskProc hides and protects what runc's defaults do.
func maskProc() error {
	for _, p := range maskedPaths {
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			continue
		case fi.IsDir():
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY, "size=0")
		default:
			err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		}
		if err != nil && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EACCES) {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range readOnlyPaths {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", p, err)
		}
		if err := unix.Mount("", p, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	return nil
}

// finish turns the calling thread (root in the pod's user namespace, in
// the container's root) into the container's process: working directory,
// Landlock, seccomp, capabilities, no_new_privs, then the identity, then
// exec. It returns only on failure.
func finish(s *Spec, argv, env []string, dir string) error {
	if len(argv) == 0 {
		return errors.New("no command")
	}
	if dir == "" {
		dir = "/"
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		// As runc does: a missing workingDir is made.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create workingDir %s: %w", dir, err)
		}
		os.Chown(dir, int(s.UID), int(s.GID))
	}
	exe, err := lookPath(argv[0], env, dir)
	if err != nil {
		return err
	}
	if s.Landlock != nil {
		if _, err := ApplyLandlock(s.Landlock); err != nil {
			return fmt.Errorf("apply Landlock: %w", err)
		}
	}
	if len(s.Seccomp) > 0 {
		if err := LoadSeccomp(s.Seccomp); err != nil {
			return fmt.Errorf("load the seccomp filter: %w", err)
		}
	}
	// After Landlock and seccomp, which need CAP_SYS_ADMIN (in the pod's
	// user namespace) where no_new_privs is not set.
	if err := LimitCapabilities(s.Capabilities); err != nil {
		return err
	}
	if s.NoNewPrivileges {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set no_new_privs: %w", err)
		}
	}
	groups := make([]int, 0, len(s.Groups))
	for _, g := range s.Groups {
		groups = append(groups, int(g))
	}
	if len(groups) > 0 || !setgroupsDenied() {
		if err := syscall.Setgroups(groups); err != nil {
			return fmt.Errorf("set supplementalGroups %v: %w", s.Groups, err)
		}
	}
	if err := syscall.Setgid(int(s.GID)); err != nil {
		return fmt.Errorf("set runAsGroup %d: %w", s.GID, err)
	}
	if err := syscall.Setuid(int(s.UID)); err != nil {
		return fmt.Errorf("set runAsUser %d: %w", s.UID, err)
	}
	if err := unix.Chdir(dir); err != nil {
		return fmt.Errorf("workingDir %s: %w", dir, err)
	}
	err = syscall.Exec(exe, argv, env)
	return fmt.Errorf("exec %q: %w", argv[0], err)
}

// setgroupsDenied reports whether this user namespace denies setgroups
// (an unprivileged runtime's own-id map): there are no groups to drop.
func setgroupsDenied() bool {
	b, err := os.ReadFile("/proc/self/setgroups")
	return err == nil && strings.TrimSpace(string(b)) == "deny"
}

// lookPath finds argv[0] as execve would through the container's PATH.
func lookPath(name string, env []string, dir string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := executable(p); err != nil {
			return "", fmt.Errorf("exec: %q: %w", name, err)
		}
		return p, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec: %q: %w", name, errNotFound)
}

var errNotFound = errors.New("executable file not found in $PATH")

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return errors.New("no such file or directory in the container's root")
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return errors.New("permission denied (not an executable file)")
	}
	return nil
}

// capNames are the Linux capabilities by name, in number order.
var capNames = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
	"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
	"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
	"CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE"}

// CapabilityNumber returns the number of a capability name ("CAP_CHOWN"
// or "CHOWN"), or -1.
func CapabilityNumber(name string) int {
	n := CapabilityName(name)
	for i, c := range capNames {
		if c == n {
			return i
		}
	}
	return -1
}

// LimitCapabilities drops every capability but keep from the bounding set
// (which bounds what the exec'd program gets as root) and empties the
// inheritable set; the init calls it on its own thread before the
// identity change (and the seccomp tests, in that order, under the filter).
func LimitCapabilities(keep []string) error {
	kept := map[int]bool{}
	for _, k := range keep {
		n := CapabilityNumber(k)
		if n < 0 {
			return fmt.Errorf("unknown capability %q", k)
		}
		kept[n] = true
	}
	last := len(capNames) - 1
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	var lo, hi uint32
	for c := 0; c <= last; c++ {
		if kept[c] {
			if c < 32 {
				lo |= 1 << c
			} else {
				hi |= 1 << (c - 32)
			}
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	data[0].Permitted &= lo
	data[1].Permitted &= hi
	// Setuid and setgid (the identity comes after this) need their
	// capabilities until then; the kernel clears them at the uid change
	// for a non-root user.
	data[0].Permitted |= data[0].Effective & (1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID)
	data[0].Effective = data[0].Permitted
	data[1].Effective = data[1].Permitted
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// recvFD reads one message from the socket sock into buf and the one
// descriptor it carries (-1 for none).
func recvFD(sock int, buf []byte) (n, fd int, err error) {
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, 0)
	if err != nil {
		return 0, -1, err
	}
	fd = -1
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) == 1 {
		if fds, err := unix.ParseUnixRights(&msgs[0]); err == nil && len(fds) == 1 {
			fd = fds[0]
		}
	}
	return n, fd, nil
}
