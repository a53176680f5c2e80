//go:build linux

package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// LeafName is where, on v2, the processes of a delegated cgroup move so
// that it may have children with controllers (the no-internal-processes
// rule): the daemon, and whatever else ran in it.
const LeafName = "supervisor"

// New detects the host's cgroups and prepares k3sm's subtree:
//
//   - v2 (a cgroup2 hierarchy holds the controllers): below the daemon's
//     own cgroup when systemd delegated it (Delegate=yes marks it with the
//     trusted.delegate / user.delegate xattr) or when it is the root of a
//     cgroup namespace; its processes move to <own>/supervisor first (a
//     daemon already in <delegated>/supervisor uses <delegated>).
//     Otherwise as root below the root cgroup; unprivileged below its own
//     cgroup if that is allowed.
//   - v1 (controllers on their own hierarchies): <hierarchy>/<own>/<Name>
//     in the memory, cpu, cpuacct and pids hierarchies.
//
// It never fails: a Manager of Version None carries the reason (Describe,
// Support), and the daemon falls back to its sampler.
func New(opts Options) *Manager { return setup(opts, thisHost(), false) }

// Detect is what New would find here, without creating or moving
// anything: the same choices, with permission checks in place of the
// writes. doctor and status use it when no runtime runs to ask.
func Detect(opts Options) Support { return setup(opts, thisHost(), true).Support() }

// host is where the setup looks: this process's view, or a test's.
type host struct {
	mountinfo, self string
	// cgroupRoot is where hierarchies are mounted by convention, looked at
	// to say why none is.
	cgroupRoot string
	euid       int
	// visible reports whether a mount point shows a cgroup filesystem (a
	// later mount over it hides it, but mountinfo still lists it).
	visible func(point string) bool
}

func thisHost() host {
	return host{mountinfo: "/proc/self/mountinfo", self: "/proc/self/cgroup", cgroupRoot: "/sys/fs/cgroup", euid: os.Geteuid(),
		visible: func(point string) bool {
			var st unix.Statfs_t
			return unix.Statfs(point, &st) == nil && (st.Type == unix.CGROUP_SUPER_MAGIC || st.Type == unix.CGROUP2_SUPER_MAGIC)
		}}
}

// setup is New (dry false) and Detect (dry true).
func setup(opts Options, h host, dry bool) *Manager {
	m := &Manager{pidsLimit: opts.PodPidsLimit, dirs: map[string]string{}}
	if m.pidsLimit == 0 {
		m.pidsLimit = DefaultPodPidsLimit
	}
	if m.pidsLimit < 0 {
		m.pidsLimit = 0
	}
	if opts.Disable {
		m.reason = "disabled in the daemon's configuration"
		m.note(CauseDisabled, "")
		return m
	}
	name := opts.Name
	if name == "" {
		name = DefaultName
	}
	if err := checkName("Options.Name", name); err != nil {
		m.reason = err.Error()
		m.note(CauseDisabled, "")
		return m
	}
	l, err := readLayout(h.mountinfo, h.self)
	if err != nil {
		m.reason = err.Error()
		m.note(CauseNotMounted, "mount /proc in the runtime's mount namespace")
		return m
	}
	hidden := hide(&l, h.visible)
	switch {
	case len(l.v1) > 0 && l.v1[Memory].mount != "":
		m.setupV1(l, name, h.euid, dry)
	case l.v2.mount != "":
		m.setupV2(l.v2, name, h.euid, dry)
	case len(l.v1) > 0:
		m.setupV1(l, name, h.euid, dry)
	case len(hidden) > 0:
		m.reason = "the cgroup hierarchies mounted at " + strings.Join(hidden, ", ") + " are hidden by a mount over them, in the runtime's mount namespace"
		m.note(CauseNotMounted, "unmount what covers "+h.cgroupRoot+" in the runtime's mount namespace, or start the server where the host's cgroup mounts are visible")
	default:
		m.reason = "no cgroup hierarchy is mounted in the runtime's mount namespace (" + h.cgroupRoot + " " + emptiness(h.cgroupRoot) + ")"
		m.note(CauseNotMounted, "if the server was started under `ip netns exec`, which remounts /sys without the cgroup mounts, start it without (`nsenter --net=/run/netns/NAME` keeps the mounts); otherwise mount cgroup2: `mount -t cgroup2 cgroup2 "+h.cgroupRoot+"`")
	}
	if m.version != None && len(m.dirs) == 0 {
		if m.reason == "" { // setupV2 may have said why
			m.reason = fmt.Sprintf("cgroup %s: no usable controller (%s)", m.version, strings.Join(m.missing, "; "))
		}
		m.version = None
	}
	return m
}

// hide drops the hierarchies whose mount point does not show them and
// returns those mount points.
func hide(l *layout, visible func(string) bool) []string {
	if visible == nil {
		return nil
	}
	var hidden []string
	if l.v2.mount != "" && !visible(l.v2.mount) {
		hidden = append(hidden, l.v2.mount)
		l.v2 = hierarchy{}
	}
	for c, h := range l.v1 {
		if !visible(h.mount) {
			if !slices.Contains(hidden, h.mount) {
				hidden = append(hidden, h.mount)
			}
			delete(l.v1, c)
		}
	}
	slices.Sort(hidden)
	return hidden
}

// emptiness says what is at the conventional mount point when nothing is
// mounted there.
func emptiness(dir string) string {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "does not exist"
	case err != nil:
		return "cannot be read: " + err.Error()
	case len(ents) == 0:
		return "is empty"
	}
	return "holds no cgroup filesystem"
}

// hierarchy is one mounted cgroup hierarchy and the daemon's cgroup in it
// (as a directory below the mount point).
type hierarchy struct {
	mount string
	own   string // mount + the daemon's cgroup path
	rel   string // the daemon's cgroup path inside the hierarchy ("/": its root)
}

type layout struct {
	v2 hierarchy
	v1 map[string]hierarchy // by controller
}

// readLayout finds the cgroup mounts (mountinfo) and the daemon's cgroups
// (/proc/self/cgroup).
func readLayout(mountinfo, self string) (layout, error) {
	l := layout{v1: map[string]hierarchy{}}
	own := map[string]string{} // controller (or "" for v2) -> path
	f, err := os.Open(self)
	if err != nil {
		return l, fmt.Errorf("read the daemon's cgroups: %w", err)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			own[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			own[c] = parts[2]
		}
	}
	f.Close()
	err = scanMounts(mountinfo, func(m mountEntry) bool {
		switch m.fstype {
		case "cgroup2":
			if l.v2.mount == "" {
				l.v2 = place(m.point, m.root, own[""])
			}
		case "cgroup":
			for _, o := range m.superopts {
				switch o {
				case Memory, CPU, CPUAcct, Pids:
					if _, dup := l.v1[o]; !dup {
						l.v1[o] = place(m.point, m.root, own[o])
					}
				}
			}
		}
		return true
	})
	return l, err
}

// mountEntry is what the cgroup code reads of one mountinfo line.
type mountEntry struct {
	root, point, fstype string
	superopts           []string
}

// scanMounts calls each for every mount in a mountinfo file, in order,
// until it returns false.
func scanMounts(mountinfo string, each func(mountEntry) bool) error {
	f, err := os.Open(mountinfo)
	if err != nil {
		return fmt.Errorf("read the mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			continue
		}
		if !each(mountEntry{root: unescape(pf[3]), point: unescape(pf[4]), fstype: qf[0], superopts: strings.Split(qf[2], ",")}) {
			break
		}
	}
	return sc.Err()
}

// place joins a mount point with the daemon's path inside the hierarchy;
// a mount of a sub-tree (root other than "/", as in a container) is
// relative to that root.
func place(point, root, path string) hierarchy {
	if path == "" {
		path = "/"
	}
	rel := path
	if root != "/" {
		if r, ok := strings.CutPrefix(path, root); ok {
			rel = r
		}
	}
	if rel == "" {
		rel = "/"
	}
	return hierarchy{mount: point, own: filepath.Join(point, rel), rel: rel}
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var n int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &n); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (m *Manager) setupV1(l layout, name string, euid int, dry bool) {
	m.version = V1
	for _, c := range []string{Memory, CPU, CPUAcct, Pids} {
		h, ok := l.v1[c]
		if !ok || h.mount == "" {
			m.missing = append(m.missing, c+": no v1 hierarchy mounted")
			m.note(CauseNoController, "mount the v1 "+c+" hierarchy, or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1)")
			continue
		}
		d := filepath.Join(h.own, name)
		if dry {
			if err := mayCreate(d); err != nil {
				m.missing = append(m.missing, fmt.Sprintf("%s: %v", c, err))
				m.note(CauseNotPermitted, v1Fix)
				continue
			}
			m.dirs[c] = d
			continue
		}
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			m.missing = append(m.missing, fmt.Sprintf("%s: create %s: %v", c, d, err))
			m.note(CauseNotPermitted, v1Fix)
			continue
		}
		if unix.Access(filepath.Join(d, "cgroup.procs"), unix.W_OK) != nil {
			m.missing = append(m.missing, fmt.Sprintf("%s: %s is not writable by uid %d", c, d, euid))
			m.note(CauseNotPermitted, v1Fix)
			continue
		}
		m.dirs[c] = d
	}
}

// v1Fix: cgroup v1 hands no subtree to a user.
const v1Fix = "run the runtime as root (cgroup v1 delegates nothing to a user), or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1) and run it under systemd with Delegate=yes"

// v2Fix: the ways to a cgroup v2 subtree of one's own.
const v2Fix = "run the runtime as root, or under systemd with Delegate=yes (`k3sm install` writes such a unit; unprivileged: `systemd-run --user -p Delegate=yes k3sm server`)"

// mayCreate is a dry run of creating cgroup d (or of using it, when it
// exists): what New would be refused.
func mayCreate(d string) error {
	target := filepath.Join(d, "cgroup.procs")
	if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
		target = filepath.Dir(d)
	}
	if err := unix.Access(target, unix.W_OK); err != nil {
		return fmt.Errorf("%s is not writable by uid %d: %w", target, os.Geteuid(), err)
	}
	return nil
}

func (m *Manager) setupV2(h hierarchy, name string, euid int, dry bool) {
	m.version = V2
	if filepath.Base(h.own) == LeafName && h.rel != "/" && delegatedV2(filepath.Dir(h.own)) {
		// Already in the leaf of a delegated cgroup (a previous daemon
		// moved us, or systemd's DelegateSubgroup=supervisor did).
		h.own, h.rel = filepath.Dir(h.own), filepath.Dir(h.rel)
	}
	delegated := delegatedV2(h.own)
	parent := h.own
	if h.rel != "/" && !delegated && euid == 0 {
		// Not handed to us: as root, a subtree of our own below the root
		// (whose processes are exempt from the no-internal-processes rule).
		parent = h.mount
	}
	avail := strings.Fields(readString(filepath.Join(parent, "cgroup.controllers")))
	var want []string
	for _, c := range []string{Memory, CPU, Pids} {
		if slices.Contains(avail, c) {
			want = append(want, c)
		} else {
			m.missing = append(m.missing, fmt.Sprintf("%s: not in %s", c, filepath.Join(parent, "cgroup.controllers")))
			m.note(CauseNoController, noControllerFix(parent))
		}
	}
	if len(want) == 0 {
		return
	}
	var err error
	if dry {
		err = mayEnableV2(parent, want)
	} else {
		err = enableV2(parent, want)
		if errors.Is(err, syscall.EBUSY) && parent == h.own && (delegated || h.rel == "/") {
			if err = evacuate(parent); err == nil {
				err = enableV2(parent, want)
			}
		}
	}
	if err != nil {
		m.reason = fmt.Sprintf("cgroup v2: %v", err)
		m.missing = append(m.missing, err.Error())
		m.note(CauseNotPermitted, v2Fix)
		return
	}
	d := filepath.Join(parent, name)
	if dry {
		if err := mayCreate(d); err != nil {
			m.missing = append(m.missing, err.Error())
			m.note(CauseNotPermitted, v2Fix)
			return
		}
	} else {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			m.missing = append(m.missing, fmt.Sprintf("create %s: %v", d, err))
			m.note(CauseNotPermitted, v2Fix)
			return
		}
		if err := enableV2(d, want); err != nil {
			m.missing = append(m.missing, err.Error())
			m.note(CauseNotPermitted, v2Fix)
			return
		}
	}
	for _, c := range want {
		m.dirs[c] = d
	}
}

// mayEnableV2 is a dry run of enableV2: the controllers are enabled
// already, or cgroup.subtree_control may be written.
func mayEnableV2(d string, cs []string) error {
	on := strings.Fields(readString(filepath.Join(d, "cgroup.subtree_control")))
	if !slices.ContainsFunc(cs, func(c string) bool { return !slices.Contains(on, c) }) {
		return nil
	}
	if err := unix.Access(filepath.Join(d, "cgroup.subtree_control"), unix.W_OK); err != nil {
		return fmt.Errorf("cgroups: enable %s below %s: %w", strings.Join(cs, ", "), d, err)
	}
	return nil
}

// delegatedV2: systemd marks a cgroup it delegated (Delegate=yes) with
// trusted.delegate (system services, v251+) or user.delegate. A user's
// systemd (252, Debian 12's) marks nothing in its units, but delegation
// gives the unit's cgroup to its uid: a cgroup an unprivileged process
// owns is one handed to it (found under `systemd-run --user -p
// Delegate=yes`, test/vm).
func delegatedV2(d string) bool {
	buf := make([]byte, 8)
	for _, x := range []string{"trusted.delegate", "user.delegate"} {
		if n, err := unix.Getxattr(d, x, buf); err == nil && n > 0 && buf[0] == '1' {
			return true
		}
	}
	var st unix.Stat_t
	euid := os.Geteuid()
	return euid != 0 && unix.Stat(d, &st) == nil && int(st.Uid) == euid
}

// evacuate moves every process of cgroup d into d/supervisor, so that d
// can have controllers enabled for children.
func evacuate(d string) error {
	leaf := filepath.Join(d, LeafName)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create %s: %w", leaf, err)
	}
	for try := 0; try < 100; try++ {
		pids, err := procs(d)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := writeFile(filepath.Join(leaf, "cgroup.procs"), fmt.Sprint(pid)); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("move process %d into %s: %w", pid, leaf, err)
			}
		}
	}
	return fmt.Errorf("processes keep appearing in %s", d)
}

func readString(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// noControllerFix says how to get a controller that parent lacks. Under a
// user manager it is user@.service's Delegate= that decides which
// controllers users get (systemd's default is cpu memory pids; some
// distributions delegate only memory pids).
func noControllerFix(parent string) string {
	if strings.Contains(parent, "/user@") {
		return "systemd hands users' units only the controllers user@.service delegates: as root, add /etc/systemd/system/user@.service.d/delegate.conf with `[Service]` and `Delegate=cpu cpuset io memory pids`, run `systemctl daemon-reload`, then restart the user's manager (log out and in, or `systemctl restart user@$(id -u).service`)"
	}
	return "enable the controller for " + parent + " (its parent's cgroup.subtree_control; systemd's Delegate=yes does) and check the kernel command line for cgroup_disable="
}
