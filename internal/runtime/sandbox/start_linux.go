//go:build linux

package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
)

// initConfig is what the shim sends the init (InitMain) on initFD.
type initConfig struct {
	Spec  *Spec    `json:"spec"`
	Stage string   `json:"stage"`
	Argv  []string `json:"argv"`
	Env   []string `json:"env"`
	Dir   string   `json:"dir"`
	// Rootless: the init builds the root (or mounts the volumes on the
	// host's view) itself, in its user namespace; the shim, not root,
	// cannot.
	Rootless bool           `json:"rootless,omitempty"`
	Mounts   []mounts.Mount `json:"mounts,omitempty"`
	Scratch  string         `json:"scratch,omitempty"`
}

// remapEnv tells the init that its maps are written after it started
// (newuidmap), so it must wait for them and exec itself again to hold
// capabilities in its user namespace.
const remapEnv = "K3SM_INIT_REMAP"

const (
	initFD   = 3 // config, then the go-ahead (one byte) or EOF to give up
	resultFD = 4 // an error text from the init, or EOF once it exec'd
	exeFD    = 5 // the shim's binary, which the init runs
)

// InitArg is the argument that makes the shim binary the init.
const InitArg = "init"

// Start starts argv as the container's process under spec: the shim's
// own executable re-executed as the init, in new user, pid, UTS and IPC
// namespaces, or with spec.Join those of the target (verified to be the
// process it was), and the caller's network namespace, with stdio and attrs
// (process group or session) as given. Before the init may go on, the
// shim (the caller, root in a mount namespace of its own) places it in
// cgroups, builds the root at stage (see prepare) and the volumes (ms,
// Targets as the container sees them). With stage "" the container keeps
// the shim's view of the host's files, with ms mounted on it by
// mounts.Apply (scratch is its stage directory).
// On cgroup v2 the init is created in its cgroup (CLONE_INTO_CGROUP)
// unless joinCgroups, which moves it there after it was created (the
// benchmark's comparison). Start returns once the workload runs, or the
// error that kept it from running.
func Start(spec *Spec, ms []mounts.Mount, stage, scratch string, cgroups []string, joinCgroups bool, argv, env []string, dir string, stdin, stdout, stderr *os.File, attrs *syscall.SysProcAttr) (*exec.Cmd, error) {
	rootless := Rootless()
	var tgt *target
	path, args := fdPath(exeFD), []string{"k3sm-shim", InitArg}
	if spec.Join != nil {
		var err error
		if tgt, err = openTarget(spec.Join); err != nil {
			return nil, err
		}
		defer tgt.Close()
		if !tgt.ownUser {
			// A Go program, being multi-threaded, cannot join a user
			// namespace: nsenter joins the target's, then runs the init.
			// Unprivileged, the shim could not; the runtime starts it
			// inside the target's user namespace.
			if rootless {
				return nil, errors.New("the shim does not run in the target container's user namespace")
			}
			nsenter, err := lookTool("nsenter")
			if err != nil {
				return nil, err
			}
			path, args = nsenter, []string{"nsenter", "--user=" + fdPath(userNSFD), "--", fdPath(exeFD), InitArg}
		}
	}
	// The init is the shim's own binary, run through a descriptor: the
	// pod's ids may not be allowed to reach its directory.
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, err
	}
	defer self.Close()
	// Config and go-ahead are messages on a socket: the go-ahead carries
	// the root's descriptor (the pod's ids cannot reach it by its path).
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	cfgW, cfgR := sp[0], os.NewFile(uintptr(sp[1]), "init")
	defer unix.Close(cfgW)
	resR, resW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		return nil, err
	}
	defer resR.Close()
	// Maps other than the runtime's own id are written by newuidmap and
	// newgidmap once the init runs (rootless with a subordinate range).
	remap := tgt == nil && rootless && !(ownOnly(spec.UIDMap, uint32(os.Geteuid())) && ownOnly(spec.GIDMap, uint32(os.Getegid())))
	a := *attrs
	env0 := []string{"GOMAXPROCS=1"}
	extra := []*os.File{cfgR, resW, self}
	if tgt != nil {
		// Born in the target's namespaces (tgt.start), joining its user
		// namespace through nsenter unless it is the shim's own.
		if !tgt.ownUser {
			extra = append(extra, tgt.user) // userNSFD
		}
	} else {
		a.Cloneflags |= syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC
	}
	switch {
	case tgt != nil, len(spec.UIDMap) == 0:
	case remap:
		a.Cloneflags |= syscall.CLONE_NEWUSER
		env0 = append(env0, remapEnv+"=1")
	default:
		a.Cloneflags |= syscall.CLONE_NEWUSER
		a.UidMappings = sysMaps(spec.UIDMap)
		a.GidMappings = sysMaps(spec.GIDMap)
		// An unprivileged process may map its own gid only with
		// setgroups denied.
		a.GidMappingsEnableSetgroups = !rootless
		// Root of the new namespace: the shim's own uid is not mapped
		// there, and an unmapped uid loses its capabilities at exec.
		a.Credential = &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true}
	}
	newCmd := func(a syscall.SysProcAttr) *exec.Cmd {
		return &exec.Cmd{
			Path: path, Args: args, Dir: "/", Env: env0,
			Stdin: stdin, Stdout: stdout, Stderr: stderr,
			ExtraFiles:  extra,
			SysProcAttr: &a,
		}
	}
	var cg *os.File
	if tgt == nil && !joinCgroups {
		cg = openCgroup2(cgroups)
	}
	var cmd *exec.Cmd
	if tgt != nil {
		cmd = newCmd(a)
		err = tgt.start(cmd)
	} else if cg != nil {
		// One cgroup v2 directory: born in it (clone3 with
		// CLONE_INTO_CGROUP), never a moment in the shim's cgroup and no
		// migration. A kernel or sandbox that refuses it (ENOSYS, EPERM
		// from a seccomp filter, EACCES) gets the join below.
		born := a
		born.UseCgroupFD, born.CgroupFD = true, int(cg.Fd())
		cmd = newCmd(born)
		if err = cmd.Start(); err != nil {
			cmd = newCmd(a)
			err = cmd.Start()
		}
		cg.Close()
	} else {
		cmd = newCmd(a)
		err = cmd.Start()
	}
	cfgR.Close()
	resW.Close()
	if err != nil {
		return nil, fmt.Errorf("start the container's init: %w", err)
	}
	fail := func(err error) (*exec.Cmd, error) {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	if remap {
		if err := writeMaps(cmd.Process.Pid, spec); err != nil {
			return fail(err)
		}
		if err := unix.Sendmsg(cfgW, []byte{'m'}, nil, nil, 0); err != nil {
			return fail(fmt.Errorf("start the container's init: %w", err))
		}
	}
	cfg := initConfig{Spec: spec, Stage: stage, Argv: argv, Env: env, Dir: dir}
	if rootless {
		cfg.Rootless, cfg.Mounts, cfg.Scratch = true, ms, scratch
	}
	b, _ := json.Marshal(cfg)
	if err := unix.Sendmsg(cfgW, b, nil, nil, 0); err != nil {
		return fail(fmt.Errorf("configure the container's init: %w", err))
	}
	if !BornInCgroup(cmd) {
		if err := JoinCgroups(cgroups, cmd.Process.Pid); err != nil {
			return fail(err)
		}
	}
	if !rootless {
		// A shim in its pod's user namespace (a runtime that is not
		// root, with a pod network) gives the volumes to fsGroup here.
		for _, o := range spec.Own {
			if err := own(o); err != nil {
				return fail(fmt.Errorf("give volume %s to fsGroup %d: %w", o.Path, o.GID, err))
			}
		}
		// The init's user namespace, for idmapped mounts (the target's,
		// opened here: nsenter may not have joined it yet).
		userns := ""
		switch {
		case len(spec.UIDMap) == 0:
		case tgt != nil:
			userns = fdPath(int(tgt.user.Fd()))
		default:
			userns = fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid)
		}
		if err := prepare(spec, ms, stage, scratch, userns); err != nil {
			return fail(err)
		}
	}
	var rights []byte
	if stage != "" && !rootless {
		rootFD, err := unix.Open(stage, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(err)
		}
		defer unix.Close(rootFD)
		rights = unix.UnixRights(rootFD)
	}
	err = unix.Sendmsg(cfgW, []byte{'g'}, rights, nil, 0)
	if err != nil {
		return fail(fmt.Errorf("start the container's init: %w", err))
	}
	msg, _ := io.ReadAll(resR)
	if len(msg) > 0 {
		cmd.Wait()
		return nil, errors.New(string(msg))
	}
	return cmd, nil
}

func sysMaps(ms []IDMap) []syscall.SysProcIDMap {
	out := make([]syscall.SysProcIDMap, len(ms))
	for i, m := range ms {
		out[i] = syscall.SysProcIDMap{ContainerID: int(m.ContainerID), HostID: int(m.HostID), Size: int(m.Size)}
	}
	return out
}

// hostRoot is the host uid (and gid) of the container's root.
func hostRoot(ms []IDMap) (uint32, bool) {
	for _, m := range ms {
		if m.ContainerID == 0 {
			return m.HostID, true
		}
	}
	return 0, false
}

// prepare builds the container's root at stage in the shim's mount
// namespace, which the init then enters and pivots into: the image
// (Lower) through an idmapped mount of the init's user namespace (ns: its
// files owned by the container's ids, though shared on disk by every pod
// of the image), an overlay with the container's own upper directory, a
// minimal /dev, a read-only /sys, and the mounts. ns is "" when the init
// builds its root itself (rootless), inside its user namespace.
func prepare(spec *Spec, ms []mounts.Mount, stage, scratch string, ns string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make the shim's mounts private: %w", err)
	}
	if spec.Lower == "" {
		// The host's view, which the init shares until the go-ahead: the
		// volumes are mounted on it now that its user namespace exists
		// (IDMapped ones map through it).
		if len(ms) == 0 {
			return nil
		}
		return mounts.ApplyInUserns(ms, scratch, ns)
	}
	lower := spec.Lower
	if ns != "" {
		lower = stage + ".lower"
		if err := idmapped(spec.Lower, lower, ns); err != nil {
			return fmt.Errorf("map the image's files into the pod's user namespace: %w", err)
		}
	}
	for _, d := range []string{stage, spec.Upper, spec.Work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if uid, ok := hostRoot(spec.UIDMap); ok && ns != "" {
		gid, _ := hostRoot(spec.GIDMap)
		if err := os.Chown(spec.Upper, int(uid), int(gid)); err != nil {
			return err
		}
	}
	if fi, err := os.Stat(spec.Lower); err == nil {
		os.Chmod(spec.Upper, fi.Mode().Perm())
	}
	opts := "lowerdir=" + lower + ",upperdir=" + spec.Upper + ",workdir=" + spec.Work
	if err := unix.Mount("overlay", stage, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount the container's root (overlay of %s): %w", spec.Lower, err)
	}
	r, err := openRoot(stage, ns)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.dev(spec, ns != ""); err != nil {
		return fmt.Errorf("make the container's /dev: %w", err)
	}
	if err := r.sys(); err != nil {
		return fmt.Errorf("make the container's /sys: %w", err)
	}
	// Mount points the init mounts on itself.
	for _, d := range []string{"proc", "dev/pts"} {
		if _, err := r.mkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, m := range ms {
		if err := r.bind(m); err != nil {
			return fmt.Errorf("volume mount %s → %s: %w", m.Source, m.Target, err)
		}
	}
	if spec.ReadOnlyRoot {
		if err := unix.Mount("", stage, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make the root read-only: %w", err)
		}
	}
	return nil
}

// idmapped mounts a clone of dir at target, its ids mapped as the user
// namespace nsPath maps them.
func idmapped(dir, target, nsPath string) error {
	if err := os.MkdirAll(target, 0o700); err != nil {
		return err
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", dir, err)
	}
	defer unix.Close(tree)
	if err := mounts.IDMap(tree, nsPath); err != nil {
		return fmt.Errorf("%s (the data dir's filesystem): %w", dir, err)
	}
	return unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

// root is the container's root being built, opened once: every path in it
// resolves with RESOLVE_IN_ROOT, so a symlink in the image cannot lead a
// mount out of it.
type root struct {
	dir    string
	fd     int
	userns string // the init's user namespace ("" for none): IDMapped volumes map through it
}

func openRoot(dir, userns string) (*root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &root{dir: dir, fd: fd, userns: userns}, nil
}

func (r *root) Close() { unix.Close(r.fd) }

func (r *root) open(rel string, flags uint64) (int, error) {
	return unix.Openat2(r.fd, rel, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
}

// mkdirAll makes directory rel (inside the root) and returns an O_PATH
// descriptor of it. Each prefix resolves from the root, so an image's
// absolute symlink (/var/run -> /run) means what it means in the pod.
func (r *root) mkdirAll(rel string, mode uint32) (int, error) {
	cur, err := unix.Dup(r.fd)
	if err != nil {
		return -1, err
	}
	prefix := ""
	for _, c := range splitPath(rel) {
		prefix += "/" + c
		next, err := r.open(prefix, unix.O_PATH|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) {
			// Missing: made in its parent as the root resolved it.
			if err = unix.Mkdirat(cur, c, mode); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = r.open(prefix, unix.O_PATH|unix.O_DIRECTORY)
			}
		}
		unix.Close(cur)
		if err != nil {
			return -1, fmt.Errorf("%s in the container's root: %w", rel, err)
		}
		cur = next
	}
	return cur, nil
}

// file makes (if missing) the regular file rel and returns an O_PATH
// descriptor of it. A symlink resolves inside the root; one that leads
// nowhere (an image's /etc/resolv.conf -> ../run/...) is replaced by the
// file, in the container's own upper layer.
func (r *root) file(rel string) (int, error) {
	fd, err := r.open(rel, unix.O_PATH)
	if !errors.Is(err, unix.ENOENT) {
		if err != nil {
			return -1, fmt.Errorf("%s in the container's root: %w", rel, err)
		}
		return fd, nil
	}
	dir, base := filepath.Split(filepath.Clean("/" + rel))
	dfd, err := r.mkdirAll(dir, 0o755)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dfd)
	unix.Unlinkat(dfd, base, 0) // a dangling symlink
	cfd, err := unix.Openat(dfd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
	if err == nil {
		unix.Close(cfd)
	}
	if err == nil || errors.Is(err, unix.EEXIST) {
		fd, err = r.open(rel, unix.O_PATH)
	}
	if err != nil {
		return -1, fmt.Errorf("%s in the container's root: %w", rel, err)
	}
	return fd, nil
}

func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(filepath.Clean("/"+p), "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// bind mounts m.Source at m.Target inside the root, making the mount
// point (a directory or a file, as the source is) where it is missing.
func (r *root) bind(m mounts.Mount) error {
	fi, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	var fd int
	if fi.IsDir() {
		fd, err = r.mkdirAll(m.Target, 0o755)
	} else {
		fd, err = r.file(m.Target)
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	tree, err := unix.OpenTree(unix.AT_FDCWD, m.Source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return err
	}
	defer unix.Close(tree)
	if m.IDMapped && r.userns != "" {
		mounts.IDMapOrWarn(tree, r.userns, m.Source)
	}
	if err := unix.MoveMount(tree, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return err
	}
	if m.ReadOnly {
		// The mount on fd's path now: reopened to name it.
		rfd, err := r.open(m.Target, unix.O_PATH)
		if err != nil {
			return err
		}
		defer unix.Close(rfd)
		return mounts.RemountReadOnly(fdPath(rfd))
	}
	return nil
}

// devices are the host's device nodes a container gets (bound: a user
// namespace cannot make device nodes).
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// dev makes /dev a tmpfs with the usual devices, links, /dev/shm, and
// /dev/pts as a mount point (the init mounts its own devpts instance).
func (r *root) dev(spec *Spec, fromHost bool) error {
	fd, err := r.mkdirAll("dev", 0o755)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// Both tmpfs belong to the pod's root (the mounter's own, when the
	// init mounts them inside its user namespace).
	owner := ""
	if uid, ok := hostRoot(spec.UIDMap); ok && fromHost {
		gid, _ := hostRoot(spec.GIDMap)
		owner = fmt.Sprintf(",uid=%d,gid=%d", uid, gid)
	}
	if err := unix.Mount("tmpfs", fdPath(fd), "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"+owner); err != nil {
		return err
	}
	dev := filepath.Join(r.dir, "dev")
	for _, d := range devices {
		p := filepath.Join(dev, d)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+d, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("/dev/%s: %w", d, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx", "core": "/proc/kcore"} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return err
		}
	}
	return unix.Mount("shm", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=65536k"+owner)
}

// sys binds the host's /sys read-only, submounts included (a pod's user
// namespace does not own the network namespace, so it cannot mount a
// sysfs of its own).
func (r *root) sys() error {
	fd, err := r.mkdirAll("sys", 0o555)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mount("/sys", fdPath(fd), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	// Read-only all the way down (cgroup and other submounts too).
	sys := filepath.Join(r.dir, "sys")
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(unix.AT_FDCWD, sys, unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("read-only: %w", err)
	}
	return nil
}

// openCgroup2 opens the one cgroup directory of dirs when it is on a
// cgroup2 filesystem (for CLONE_INTO_CGROUP), else returns nil.
func openCgroup2(dirs []string) *os.File {
	if len(dirs) != 1 {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dirs[0], &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil
	}
	f, err := os.OpenFile(dirs[0], os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	return f
}

// BornInCgroup reports whether cmd, started by Start, was created in its
// cgroup by the kernel (CLONE_INTO_CGROUP) rather than moved there.
func BornInCgroup(cmd *exec.Cmd) bool {
	return cmd != nil && cmd.SysProcAttr != nil && cmd.SysProcAttr.UseCgroupFD
}
