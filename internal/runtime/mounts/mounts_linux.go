//go:build linux

package mounts

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Namespaced reports whether containers get a mount namespace of their own
// here (so Targets are the container's absolute paths): when the daemon is
// root, or when unprivileged user namespaces are usable.
func Namespaced() bool {
	if os.Geteuid() == 0 {
		return true
	}
	nsOnce.Do(func() { nsUsable = probeUserns() })
	return nsUsable
}

var (
	nsOnce   sync.Once
	nsUsable bool
)

func probeUserns() bool {
	// Debian's switch (older kernels), the generic limit, and Ubuntu's
	// AppArmor restriction (a user namespace without capabilities).
	for file, bad := range map[string]string{
		"/proc/sys/kernel/unprivileged_userns_clone":             "0",
		"/proc/sys/user/max_user_namespaces":                     "0",
		"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1",
	} {
		if b, err := os.ReadFile(file); err == nil && strings.TrimSpace(string(b)) == bad {
			return false
		}
	}
	truePath, err := exec.LookPath("true")
	if err != nil {
		return true
	}
	attr := sysProcAttr(nil, false)
	cmd := exec.Command(truePath)
	cmd.SysProcAttr = attr
	return cmd.Run() == nil
}

// SysProcAttr returns a copy of base (which may be nil) that starts the
// process in a new mount namespace: CLONE_NEWNS when the daemon is root,
// CLONE_NEWUSER|CLONE_NEWNS with the daemon's own uid and gid mapped to
// themselves otherwise (setgroups denied, as the kernel requires for an
// unprivileged gid map). A non-root uid loses its capabilities at execve,
// even in its own user namespace, so the process also gets CAP_SYS_ADMIN
// as an ambient capability (in that namespace only) to mount; it must
// start its own children with StartWithoutCaps.
func SysProcAttr(base *syscall.SysProcAttr) *syscall.SysProcAttr {
	return sysProcAttr(base, os.Geteuid() == 0)
}

func sysProcAttr(base *syscall.SysProcAttr, root bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{}
	if base != nil {
		c := *base
		a = &c
	}
	a.Cloneflags |= syscall.CLONE_NEWNS
	if !root {
		uid, gid := os.Geteuid(), os.Getegid()
		a.Cloneflags |= syscall.CLONE_NEWUSER
		a.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		a.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		a.GidMappingsEnableSetgroups = false
		a.AmbientCaps = append(slices.Clone(a.AmbientCaps), unix.CAP_SYS_ADMIN)
	}
	return a
}

// StartWithoutCaps calls start (which forks and execs: exec.Cmd.Start) on
// an OS thread whose ambient capabilities are cleared, so the child keeps
// none of the CAP_SYS_ADMIN SysProcAttr gave an unprivileged caller
// (capabilities are per thread; the fork happens on the calling one).
func StartWithoutCaps(start func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	return start()
}

var (
	nsenterOnce sync.Once
	nsenterPath string
	nsenterWdns bool
	nsenterErr  error
)

// EnterArgv returns the command line that runs argv inside the mount
// namespace, the network namespace (the pod's own network) and the user
// namespace of process pid, each where it differs from the caller's, with
// util-linux's nsenter: a multi-threaded Go process cannot setns(2) into a
// mount namespace itself. dir is the working directory as seen inside the
// namespace ("" = the namespace's root); it may not exist outside, so run
// the returned command from "/" (cmd.Dir). The command runs as the
// caller's user (--preserve-credentials) and nsenter execs it: same pid,
// process group, terminal and exit status as running argv directly.
//
// When pid shares all of them with the caller (a container without mounts
// in the node's network) argv itself is returned, and the caller runs it
// in dir as before.
func EnterArgv(pid int, dir string, argv []string) ([]string, error) {
	if len(argv) == 0 {
		return nil, errors.New("enter container namespaces: empty command")
	}
	differs := func(ns string) (bool, error) {
		theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err != nil {
			return false, fmt.Errorf("enter namespaces of process %d: %w", pid, err)
		}
		ours, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			return false, fmt.Errorf("enter namespaces: %w", err)
		}
		return theirs != ours, nil
	}
	var flags []string
	for _, ns := range []struct{ name, flag string }{{"mnt", "--mount"}, {"net", "--net"}, {"user", "--user"}} {
		d, err := differs(ns.name)
		if err != nil {
			return nil, err
		}
		if d {
			flags = append(flags, ns.flag)
		}
	}
	if len(flags) == 0 {
		return argv, nil
	}
	nsenterOnce.Do(func() {
		nsenterPath, nsenterErr = exec.LookPath("nsenter")
		if nsenterErr != nil {
			nsenterErr = fmt.Errorf("nsenter (from util-linux) is needed to run commands in a container's namespaces: %w", nsenterErr)
			return
		}
		out, _ := exec.Command(nsenterPath, "--help").CombinedOutput()
		nsenterWdns = strings.Contains(string(out), "--wdns")
	})
	if nsenterErr != nil {
		return nil, nsenterErr
	}
	out := append([]string{nsenterPath, "--target", fmt.Sprint(pid)}, flags...)
	if slices.Contains(flags, "--user") {
		out = append(out, "--preserve-credentials")
	}
	switch {
	case dir == "":
	case nsenterWdns:
		// --wd would open the directory in the caller's namespace.
		// util-linux 2.38 declares its argument optional: it
		// must be attached.
		out = append(out, "--wdns="+dir)
	default:
		// util-linux before 2.38: change directory from a shell inside.
		out = append(out, "--", "/bin/sh", "-c", `cd -- "$0" && exec "$@"`, dir)
		return append(out, argv...), nil
	}
	out = append(out, "--")
	return append(out, argv...), nil
}

// Apply makes each mount visible at its Target, in order (parents before
// children). It must run in a fresh mount namespace of the calling process
// (see SysProcAttr): it first makes every mount a slave, so host mounts
// still propagate in and none of ours leak out, and refuses to run when the
// process shares its parent's mount namespace. stageDir is a directory on
// the host the process may create and use (the new root when a Target's
// missing part starts right under "/").
//
// Nothing is created on the host filesystem: a Target that does not exist
// is made in a tmpfs mounted over its deepest existing ancestor, on which
// each of the ancestor's original entries is bind-mounted back ("mirror").
// When that ancestor is "/", the process pivots into a tmpfs root holding a
// bind of every top-level entry. A missing Target inside an earlier,
// writable mount of the list is created in that mount (as runc does).
func Apply(ms []Mount, stageDir string) error { return ApplyInUserns(ms, stageDir, "") }

// ApplyInUserns is Apply for a container in the user namespace userns (a
// /proc/<pid>/ns/user path; "" for none): its IDMapped mounts show their
// files' ids as that namespace maps them (see IDMap).
func ApplyInUserns(ms []Mount, stageDir, userns string) error {
	if err := checkPrivateNS(); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts slave: %w", err)
	}
	a := &applier{stage: stageDir, tmp: map[string]bool{}}
	// Every source is opened first: a mount of the list may cover the
	// path of a later one's source (a bind over /tmp, with a data dir or
	// a hostPath below /tmp).
	srcs := make([]int, len(ms))
	defer func() {
		for _, fd := range srcs {
			if fd > 0 {
				unix.Close(fd)
			}
		}
	}()
	for i, m := range ms {
		if _, err := os.Stat(m.Source); err != nil {
			return mountError(m, "source", err)
		}
		// A detached clone of the source: it outlives the old root when
		// a mount pivots (newRoot), and a later mount cannot cover it.
		fd, err := unix.OpenTree(unix.AT_FDCWD, m.Source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return mountError(m, "source", err)
		}
		srcs[i] = fd
		if m.IDMapped && userns != "" {
			IDMapOrWarn(fd, userns, m.Source)
		}
	}
	for i, m := range ms {
		if err := a.apply(m, srcs[i]); err != nil {
			return err
		}
	}
	return nil
}

// IDMap makes the detached mount tree (from open_tree with
// OPEN_TREE_CLONE) show its files' ids as the user namespace userns maps
// them: on disk a file keeps the id a process of that namespace sees. The
// caller must be root on the host; a filesystem without idmapped mounts
// (Linux 5.12+: ext4, XFS, btrfs, tmpfs 6.3+, …) is refused.
func IDMap(tree int, userns string) error {
	nsfd, err := unix.Open(userns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(nsfd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(nsfd)}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("idmapped mount (its filesystem, or one mounted below it, does not support idmapped mounts; Linux 5.12 or later): %w", err)
	}
	return nil
}

// IDMapOrWarn idmaps tree (see IDMap) or, where the filesystem cannot
// (/proc, /sys, network filesystems), says so on stderr (the shim's log)
// and leaves it a plain bind: its files then show the host's ids, as
// before idmapped volumes.
func IDMapOrWarn(tree int, userns, source string) {
	if err := IDMap(tree, userns); err != nil {
		fmt.Fprintf(os.Stderr, "volume %s: mounted with the host's ids: %v\n", source, err)
	}
}

// checkPrivateNS refuses to mount in the namespace of the process that
// started us: that would change the host.
func checkPrivateNS() error {
	ours, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	if theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid())); err == nil && theirs == ours {
		return errors.New("refusing to mount volumes: the process shares its parent's mount namespace (start it with mounts.SysProcAttr)")
	}
	return nil
}

type applier struct {
	stage string
	// tmp holds directories that are ours: mirrored tmpfs and directories
	// created in them, where a missing path is made with mkdir.
	tmp map[string]bool
	// done are earlier mounts: a missing path under a writable one is made
	// in it.
	done []Mount
	n    int
}

// mountError names the mount and the step.
func mountError(m Mount, step string, err error) error {
	return fmt.Errorf("volume mount %s → %s: %s: %w", m.Source, m.Target, step, err)
}

func (a *applier) apply(m Mount, src int) error {
	if !filepath.IsAbs(m.Target) {
		return mountError(m, "target", errors.New("not an absolute path"))
	}
	target := filepath.Clean(m.Target)
	if target == "/" {
		return mountError(m, "target", errors.New("cannot mount over /"))
	}
	source := fmt.Sprintf("/proc/self/fd/%d", src)
	sfi, err := os.Stat(source)
	if err != nil {
		return mountError(m, "source", err)
	}
	existing, missing, err := resolve(target)
	if err != nil {
		return mountError(m, "resolve target", err)
	}
	dst := filepath.Join(append([]string{existing}, missing...)...)
	if len(missing) == 0 {
		tfi, err := os.Stat(dst)
		if err != nil {
			return mountError(m, "target", err)
		}
		if tfi.IsDir() != sfi.IsDir() {
			return mountError(m, "target", fmt.Errorf("%s is %s but %s is %s", m.Source, kind(sfi), dst, kind(tfi)))
		}
	} else {
		efi, err := os.Stat(existing)
		if err != nil {
			return mountError(m, "target", err)
		}
		if !efi.IsDir() {
			return mountError(m, "target", fmt.Errorf("%s is not a directory", existing))
		}
		if !a.ours(existing) {
			if existing == "/" {
				if err := a.newRoot(); err != nil {
					return mountError(m, "new root for "+dst, err)
				}
			} else if err := mirror(existing); err != nil {
				return mountError(m, "mirror "+existing, err)
			}
			a.tmp[existing] = true
		}
		// Make the missing part: directories, and an empty file for a
		// file mount.
		p := existing
		for i, c := range missing {
			p = filepath.Join(p, c)
			if i == len(missing)-1 && !sfi.IsDir() {
				f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
				if err != nil {
					return mountError(m, "create mount point", err)
				}
				f.Close()
				break
			}
			if err := os.Mkdir(p, 0o755); err != nil {
				return mountError(m, "create mount point", err)
			}
			a.tmp[p] = true
		}
	}
	if err := unix.MoveMount(src, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return mountError(m, "bind "+dst, err)
	}
	if m.ReadOnly {
		if err := RemountReadOnly(dst); err != nil {
			return mountError(m, "read-only remount", err)
		}
	}
	a.done = append(a.done, Mount{Source: m.Source, Target: dst, ReadOnly: m.ReadOnly})
	// The mount hides whatever was ours below dst.
	for p := range a.tmp {
		if within(p, dst) {
			delete(a.tmp, p)
		}
	}
	return nil
}

// ours reports whether a missing path under dir may be made with mkdir:
// dir is in one of our tmpfs, or in an earlier writable mount.
func (a *applier) ours(dir string) bool {
	if a.tmp[dir] {
		return true
	}
	for i := len(a.done) - 1; i >= 0; i-- {
		if within(dir, a.done[i].Target) {
			return !a.done[i].ReadOnly
		}
	}
	return false
}

func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

func kind(fi os.FileInfo) string {
	if fi.IsDir() {
		return "a directory"
	}
	return "not a directory"
}

// resolve splits the absolute, clean path p into its existing part with
// every symlink resolved, and the missing components after it.
func resolve(p string) (string, []string, error) {
	comps := split(p)
	cur := "/"
	links := 0
	for i := 0; i < len(comps); i++ {
		c := comps[i]
		if c == "." {
			continue
		}
		if c == ".." {
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if errors.Is(err, os.ErrNotExist) {
			var rest []string
			for _, r := range comps[i:] {
				switch r {
				case ".":
				case "..":
					if len(rest) == 0 {
						return "", nil, fmt.Errorf("%s: .. above a missing directory", p)
					}
					rest = rest[:len(rest)-1]
				default:
					rest = append(rest, r)
				}
			}
			return cur, rest, nil
		}
		if err != nil {
			return "", nil, err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			if links++; links > 255 {
				return "", nil, fmt.Errorf("%s: too many levels of symbolic links", p)
			}
			dest, err := os.Readlink(next)
			if err != nil {
				return "", nil, err
			}
			if filepath.IsAbs(dest) {
				cur = "/"
			}
			comps = append(split(dest), comps[i+1:]...)
			i = -1
			continue
		}
		if !fi.IsDir() && i < len(comps)-1 {
			return "", nil, fmt.Errorf("%s: %s is not a directory", p, next)
		}
		cur = next
	}
	return cur, nil, nil
}

func split(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

// entry is one original entry of a directory being mirrored, with a
// detached recursive clone of its mounts (none for a symlink).
type entry struct {
	name string
	fi   os.FileInfo
	link string
	tree int
}

// cloneEntries clones every entry of dir (a recursive bind each, detached,
// held by a descriptor) before anything covers dir.
func cloneEntries(dir string) ([]entry, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var es []entry
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			closeEntries(es)
			return nil, err
		}
		e := entry{name: de.Name(), fi: fi, tree: -1}
		if fi.Mode()&os.ModeSymlink != 0 {
			if e.link, err = os.Readlink(p); err != nil {
				closeEntries(es)
				return nil, err
			}
		} else if e.tree, err = unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			closeEntries(es)
			if errors.Is(err, unix.ENOSYS) {
				err = fmt.Errorf("open_tree needs Linux 5.2 or later: %w", err)
			}
			return nil, fmt.Errorf("clone %s: %w", p, err)
		}
		es = append(es, e)
	}
	return es, nil
}

func closeEntries(es []entry) {
	for _, e := range es {
		if e.tree >= 0 {
			unix.Close(e.tree)
		}
	}
}

// mountTmpfs mounts a tmpfs on dir with the mode and owner of fi.
func mountTmpfs(dir string, fi os.FileInfo) error {
	st := fi.Sys().(*syscall.Stat_t)
	mode := fmt.Sprintf("mode=%o", uint32(fi.Mode().Perm())|uint32(st.Mode&0o7000))
	err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("%s,uid=%d,gid=%d", mode, st.Uid, st.Gid))
	if errors.Is(err, unix.EINVAL) {
		// In a user namespace the owner may not be mapped.
		err = unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, mode)
	}
	return err
}

// populate recreates the entries in dir (now a fresh tmpfs) and moves each
// entry's clone onto its placeholder.
func populate(dir string, es []entry) error {
	for _, e := range es {
		p := filepath.Join(dir, e.name)
		st := e.fi.Sys().(*syscall.Stat_t)
		switch {
		case e.tree < 0:
			if err := os.Symlink(e.link, p); err != nil {
				return err
			}
			os.Lchown(p, int(st.Uid), int(st.Gid))
			continue
		case e.fi.IsDir():
			if err := os.Mkdir(p, e.fi.Mode().Perm()); err != nil {
				return err
			}
		default:
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, e.fi.Mode().Perm())
			if err != nil {
				return err
			}
			f.Close()
		}
		os.Lchown(p, int(st.Uid), int(st.Gid))
		if err := unix.MoveMount(e.tree, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("bind %s back: %w", p, err)
		}
	}
	return nil
}

// mirror covers dir with a tmpfs holding the same entries (each bound back
// from the original), so new entries can be made in it without touching
// the host.
func mirror(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	es, err := cloneEntries(dir)
	if err != nil {
		return err
	}
	defer closeEntries(es)
	if err := mountTmpfs(dir, fi); err != nil {
		return fmt.Errorf("tmpfs: %w", err)
	}
	return populate(dir, es)
}

// newRoot makes "/" ours: a tmpfs under the stage directory gets a bind of
// every top-level entry, and the process pivots into it. The old root is
// detached; paths outside the new ones resolve as before.
func (a *applier) newRoot() error {
	if a.stage == "" {
		return errors.New("no stage directory")
	}
	fi, err := os.Stat("/")
	if err != nil {
		return err
	}
	a.n++
	dir := filepath.Join(a.stage, fmt.Sprintf("root%d", a.n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// Clone before the tmpfs exists, so the clones do not contain it.
	es, err := cloneEntries("/")
	if err != nil {
		return err
	}
	defer closeEntries(es)
	if err := mountTmpfs(dir, fi); err != nil {
		return fmt.Errorf("tmpfs: %w", err)
	}
	if err := populate(dir, es); err != nil {
		return err
	}
	if err := os.Chdir(dir); err != nil {
		return err
	}
	// pivot_root(".", "."): the old root ends up stacked on the new one,
	// and goes with a lazy unmount.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	// The mount point is an ordinary directory again in the new view.
	os.Remove(dir)
	os.Remove(a.stage)
	return nil
}

// RemountReadOnly makes the bind at dir read-only, keeping the flags the
// kernel locks on mounts inherited into a user namespace.
func RemountReadOnly(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	for _, f := range []struct{ st, ms uintptr }{
		{unix.ST_NOSUID, unix.MS_NOSUID},
		{unix.ST_NODEV, unix.MS_NODEV},
		{unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
		{unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if uintptr(st.Flags)&f.st != 0 {
			flags |= f.ms
		}
	}
	return unix.Mount("", dir, "", flags, "")
}
