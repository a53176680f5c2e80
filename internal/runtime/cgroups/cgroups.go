// Package cgroups gives every pod and container of the runtime daemon a
// cgroup of its own, on cgroup v2 (unified) or v1 (one hierarchy per
// controller), and reads limits' effects back: OOM kills and usage.
//
// Layout, below the subtree k3sm owns (see New):
//
//	<subtree>/pod<uid>/            the pod: pod-level limits (kubelet's rule)
//	<subtree>/pod<uid>/<container> one container attempt: its limits
//
// On v1 the same layout exists in every hierarchy used (memory, cpu,
// cpuacct, pids; co-mounted controllers share a directory). Only files are
// written: the package is the standard library and x/sys.
package cgroups

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Version is the cgroup setup in use.
type Version int

const (
	// None: no cgroups (not Linux, not permitted, or disabled); the daemon
	// falls back to its sampler.
	None Version = iota
	V1
	V2
)

func (v Version) String() string {
	switch v {
	case V1:
		return "v1"
	case V2:
		return "v2"
	}
	return "none"
}

// The controllers k3sm uses.
const (
	Memory  = "memory"
	CPU     = "cpu"
	CPUAcct = "cpuacct" // v1 only: CPU usage (v2 has it in cpu.stat)
	Pids    = "pids"
)

// DefaultPodPidsLimit caps each pod's processes and threads: well above
// what a service needs (a JVM with a few hundred threads), low enough that a
// fork bomb in one pod cannot exhaust the node's pid space (pid_max is
// 4194304 on 64-bit; the kubelet has no default, 4096 is what most
// distributions' podPidsLimit guides suggest).
const DefaultPodPidsLimit = 4096

// DefaultName is the subtree below the daemon's own cgroup.
const DefaultName = "k3sm"

// CPUPeriod is the CFS period, 100 ms, as the kubelet uses.
const CPUPeriod = 100_000 // µs

// Options configure New.
type Options struct {
	// Name of the subtree k3sm owns below the daemon's cgroup (default
	// "k3sm"). One daemon per subtree.
	Name string
	// PodPidsLimit caps each pod's tasks: 0 takes DefaultPodPidsLimit,
	// negative sets none.
	PodPidsLimit int64
	// Disable: use no cgroups at all (the daemon's sampler enforces).
	Disable bool
}

// Resources are the limits of one cgroup, in canonical units; zero means
// unset.
type Resources struct {
	MemoryLimitBytes int64
	CPULimitMillis   int64
	// CPURequestMillis becomes the CPU weight (shares); zero is the
	// minimum weight, as the kubelet gives a container without a request.
	CPURequestMillis int64
	PidsLimit        int64
}

// Usage is one reading of a container's cgroup.
type Usage struct {
	CPUNanos uint64
	// MemoryBytes is the cgroup's charge; WorkingSetBytes that minus
	// inactive file pages (what the kubelet and kubectl top call the
	// working set, and what eviction ranks by); RSSBytes the anonymous
	// memory.
	MemoryBytes     uint64
	WorkingSetBytes uint64
	RSSBytes        uint64
	Processes       uint32
	// HasMemory and HasCPU say which readings the cgroups provide (a
	// controller may be missing).
	HasMemory, HasCPU bool
}

// Manager creates, limits, reads and removes pod and container cgroups.
// The zero Version (None) is valid: every call but Describe is then a
// no-op or an error saying so.
type Manager struct {
	version Version
	// dirs maps each controller in use to k3sm's subtree in its
	// hierarchy (all the same directory on v2).
	dirs map[string]string
	// missing: controllers wanted but not available, and why.
	missing []string
	reason  string // why None
	// cause and fix: the first obstacle met (a Cause), what removes it.
	cause, fix string
	pidsLimit  int64
}

// note records the first obstacle to a controller and its fix.
func (m *Manager) note(cause, fix string) {
	if m.cause == "" {
		m.cause, m.fix = cause, fix
	}
}

// Version is the setup in force (None for a nil Manager).
func (m *Manager) Version() Version {
	if m == nil {
		return None
	}
	return m.version
}

// Has reports whether controller (Memory, CPU, Pids) limits pods.
func (m *Manager) Has(controller string) bool {
	if m == nil {
		return false
	}
	_, ok := m.dirs[controller]
	return ok && m.version != None
}

// Causes of a limit the kernel does not enforce (Support.Cause).
const (
	// CauseDisabled: Options.Disable.
	CauseDisabled = "disabled"
	// CauseNotLinux: cgroups are a Linux feature.
	CauseNotLinux = "not-linux"
	// CauseNotMounted: no cgroup hierarchy is visible in the runtime's
	// mount namespace (/sys remounted, as `ip netns exec` does, or a
	// mount hiding /sys/fs/cgroup).
	CauseNotMounted = "not-mounted"
	// CauseNotPermitted: the hierarchy is there, but the runtime may not
	// create cgroups in it (not root and not delegated, or read-only).
	CauseNotPermitted = "not-permitted"
	// CauseNoController: the kernel, or the cgroup the runtime is in, does
	// not offer the controller.
	CauseNoController = "no-controller"
)

// Support is which pod limits the kernel enforces through the runtime's
// cgroups: what New set up (Manager.Support) or, where no runtime runs,
// what one would set up (Detect). The running daemon reports it in
// GetRuntimeInfo; doctor and status show it. Where a limit is missing the
// sampler stands in: memory checked about once a second, CPU only as a
// nice priority, no pids limit.
type Support struct {
	Version Version
	// Enforced are the limits pods get, of CPU, Memory and Pids, sorted.
	Enforced []string
	// Cause (one of the Cause constants), Reason and Fix say why a limit
	// is not enforced and what to do; empty when all are, Fix also when
	// nothing can be done (CauseNotLinux).
	Cause, Reason, Fix string
}

// Enforces reports whether the kernel holds pods to controller's limits.
func (s Support) Enforces(controller string) bool { return slices.Contains(s.Enforced, controller) }

// Describe is one line: the version and what is enforced, or why not.
func (s Support) Describe() string {
	if s.Version == None {
		return "no cgroups: " + s.Reason
	}
	d := fmt.Sprintf("cgroup %s: %s limits enforced", s.Version, strings.Join(s.Enforced, ", "))
	if s.Reason != "" {
		d += "; " + s.Reason
	}
	return d
}

// Support says which limits the Manager enforces and, where one is
// missing, why.
func (m *Manager) Support() Support {
	if m == nil {
		return Support{Cause: CauseDisabled, Reason: "the runtime runs without a cgroup manager"}
	}
	s := Support{Version: m.version, Cause: m.cause, Fix: m.fix}
	if m.version == None {
		s.Reason = m.reason
		if s.Cause == "" {
			s.Cause = CauseNoController
		}
		return s
	}
	for _, c := range []string{CPU, Memory, Pids} {
		if m.Has(c) {
			s.Enforced = append(s.Enforced, c)
		}
	}
	if len(s.Enforced) == 3 {
		return Support{Version: m.version, Enforced: s.Enforced}
	}
	s.Reason = "not available: " + strings.Join(m.missing, "; ")
	if s.Cause == "" {
		s.Cause = CauseNoController
	}
	return s
}

// Describe says what is in force, for the daemon's log.
func (m *Manager) Describe() string {
	if m.version == None {
		return "no cgroups (" + m.reason + ")"
	}
	var cs []string
	for c := range m.dirs {
		cs = append(cs, c)
	}
	slices.Sort(cs)
	s := fmt.Sprintf("cgroup %s, controllers %s, pods under %s", m.version, strings.Join(cs, ","), m.base())
	if len(m.missing) > 0 {
		s += "; not available: " + strings.Join(m.missing, "; ")
	}
	return s
}

// base is one subtree directory, for messages.
func (m *Manager) base() string {
	for _, c := range []string{Memory, CPU, Pids, CPUAcct} {
		if d, ok := m.dirs[c]; ok {
			return d
		}
	}
	return ""
}

// PodPidsLimit is the per-pod pids limit in force (0: none).
func (m *Manager) PodPidsLimit() int64 { return m.pidsLimit }

// uniqueDirs lists the subtree directories (co-mounted v1 controllers and
// v2 share one).
func (m *Manager) uniqueDirs() []string {
	var out []string
	for _, c := range []string{Memory, CPU, CPUAcct, Pids} {
		if d, ok := m.dirs[c]; ok && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

func podName(uid string) string { return "pod" + uid }

func checkName(what, s string) error {
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\x00\n") {
		return fmt.Errorf("cgroups: %s %q cannot name a cgroup directory: use a non-empty name without slashes", what, s)
	}
	return nil
}

// PodDirs are the pod's cgroup directories (one per hierarchy).
func (m *Manager) PodDirs(uid string) []string {
	var out []string
	for _, d := range m.uniqueDirs() {
		out = append(out, filepath.Join(d, podName(uid)))
	}
	return out
}

// ContainerDirs are the container's cgroup directories, what the shim
// places the workload in (shim.Config.Cgroups).
func (m *Manager) ContainerDirs(uid, name string) []string {
	var out []string
	for _, d := range m.PodDirs(uid) {
		out = append(out, filepath.Join(d, name))
	}
	return out
}

func (m *Manager) dir(controller, uid, name string) (string, bool) {
	d, ok := m.dirs[controller]
	if !ok || m.version == None {
		return "", false
	}
	d = filepath.Join(d, podName(uid))
	if name != "" {
		d = filepath.Join(d, name)
	}
	return d, true
}

var errNone = errors.New("cgroups: not in use on this node")

// SetPod creates the pod's cgroup if needed and sets its limits (the pod's
// effective resources, see package pod; the pids limit is the node's).
func (m *Manager) SetPod(uid string, r Resources) error {
	if m.version == None {
		return errNone
	}
	if err := checkName("pod uid", uid); err != nil {
		return err
	}
	r.PidsLimit = m.pidsLimit
	for _, d := range m.PodDirs(uid) {
		if err := m.mkdir(d, true); err != nil {
			return err
		}
	}
	return m.set(uid, "", r)
}

// NewContainer gives a container attempt a fresh cgroup below its pod's
// (SetPod first): whatever an earlier attempt left there is killed and
// the old cgroup removed, so counters (OOM kills, CPU) start at zero. It
// returns the directories to place the workload in.
func (m *Manager) NewContainer(uid, name string, r Resources) ([]string, error) {
	if m.version == None {
		return nil, errNone
	}
	if err := checkName("pod uid", uid); err != nil {
		return nil, err
	}
	if err := checkName("container name", name); err != nil {
		return nil, err
	}
	dirs := m.ContainerDirs(uid, name)
	for _, d := range dirs {
		if err := removeTree(d); err != nil {
			return nil, err
		}
	}
	for _, d := range dirs {
		if err := m.mkdir(d, false); err != nil {
			return nil, err
		}
	}
	if err := m.set(uid, name, r); err != nil {
		return nil, err
	}
	return dirs, nil
}

// mkdir creates a cgroup and, on v2 for a parent (not a leaf holding
// processes: the no-internal-processes rule), enables the controllers in
// use for its children.
func (m *Manager) mkdir(d string, parent bool) error {
	if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("cgroups: create %s: %w", d, err)
	}
	if m.version == V2 && parent {
		return enableV2(d, m.v2Controllers())
	}
	return nil
}

func (m *Manager) v2Controllers() []string {
	var cs []string
	for _, c := range []string{Memory, CPU, Pids} {
		if _, ok := m.dirs[c]; ok {
			cs = append(cs, c)
		}
	}
	return cs
}

// enableV2 enables controllers in d's cgroup.subtree_control, so that d's
// children get their files.
func enableV2(d string, cs []string) error {
	for _, c := range cs {
		if err := writeFile(filepath.Join(d, "cgroup.subtree_control"), "+"+c); err != nil {
			return fmt.Errorf("cgroups: enable %s below %s: %w", c, d, err)
		}
	}
	return nil
}

// set writes the limits of the pod (name "") or a container.
func (m *Manager) set(uid, name string, r Resources) error {
	what := "pod " + uid
	if name != "" {
		what = "container " + name + " of pod " + uid
	}
	var errs []error
	if d, ok := m.dir(Memory, uid, name); ok {
		errs = append(errs, m.setMemory(d, r.MemoryLimitBytes, name != ""))
	}
	if d, ok := m.dir(CPU, uid, name); ok {
		errs = append(errs, m.setCPU(d, r.CPULimitMillis, r.CPURequestMillis))
	}
	if d, ok := m.dir(Pids, uid, name); ok {
		errs = append(errs, m.setPids(d, r.PidsLimit))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cgroups: limits of %s: %w", what, err)
	}
	return nil
}

func (m *Manager) setMemory(d string, limit int64, container bool) error {
	if m.version == V2 {
		v := "max"
		if limit > 0 {
			v = strconv.FormatInt(limit, 10)
		}
		if err := writeFile(filepath.Join(d, "memory.max"), v); err != nil {
			return err
		}
		// No swap beyond the limit (the kubelet's default, NoSwap).
		if exists(filepath.Join(d, "memory.swap.max")) {
			if err := writeFile(filepath.Join(d, "memory.swap.max"), "0"); err != nil {
				return err
			}
		}
		// An OOM kill ends the whole container, as the kubelet asks on v2.
		if container && exists(filepath.Join(d, "memory.oom.group")) {
			return writeFile(filepath.Join(d, "memory.oom.group"), "1")
		}
		return nil
	}
	v := "-1"
	if limit > 0 {
		v = strconv.FormatInt(limit, 10)
	}
	memsw := filepath.Join(d, "memory.memsw.limit_in_bytes")
	hasSw := exists(memsw)
	// memsw must stay >= the memory limit: raise it first, lower it last.
	if hasSw && (limit <= 0 || limit > readInt(filepath.Join(d, "memory.limit_in_bytes"))) {
		if err := writeFile(memsw, v); err != nil {
			return err
		}
		hasSw = false
	}
	if err := writeFile(filepath.Join(d, "memory.limit_in_bytes"), v); err != nil {
		return err
	}
	if hasSw {
		return writeFile(memsw, v)
	}
	return nil
}

func (m *Manager) setCPU(d string, limitMillis, requestMillis int64) error {
	shares := CPUShares(requestMillis)
	quota := CPUQuota(limitMillis)
	if m.version == V2 {
		max := "max " + strconv.Itoa(CPUPeriod)
		if quota > 0 {
			max = fmt.Sprintf("%d %d", quota, CPUPeriod)
		}
		if err := writeFile(filepath.Join(d, "cpu.max"), max); err != nil {
			return err
		}
		return writeFile(filepath.Join(d, "cpu.weight"), strconv.FormatUint(CPUWeight(shares), 10))
	}
	if err := writeFile(filepath.Join(d, "cpu.shares"), strconv.FormatUint(shares, 10)); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(d, "cpu.cfs_period_us"), strconv.Itoa(CPUPeriod)); err != nil {
		return err
	}
	q := "-1"
	if quota > 0 {
		q = strconv.FormatInt(quota, 10)
	}
	return writeFile(filepath.Join(d, "cpu.cfs_quota_us"), q)
}

func (m *Manager) setPids(d string, limit int64) error {
	v := "max"
	if limit > 0 {
		v = strconv.FormatInt(limit, 10)
	}
	return writeFile(filepath.Join(d, "pids.max"), v)
}

// The kubelet's conversions (pkg/kubelet/cm/helpers_linux.go).
const (
	minShares     = 2
	maxShares     = 262144
	sharesPerCPU  = 1024
	minQuotaUsecs = 1000
)

// CPUShares is the kubelet's MilliCPUToShares: max(2, millis*1024/1000).
func CPUShares(millis int64) uint64 {
	if millis <= 0 {
		return minShares
	}
	s := millis * sharesPerCPU / 1000
	return uint64(min(max(s, minShares), maxShares))
}

// CPUWeight is the v2 weight of shares (the kubelet's and runc's
// CpuSharesToCpuWeight): 1 + (shares-2)*9999/262142.
func CPUWeight(shares uint64) uint64 {
	if shares == 0 {
		return 0
	}
	return 1 + ((shares-2)*9999)/262142
}

// CPUQuota is the kubelet's MilliCPUToQuota for the 100 ms period, in µs:
// 0 for no limit, at least 1 ms.
func CPUQuota(millis int64) int64 {
	if millis <= 0 {
		return 0
	}
	return max(millis*CPUPeriod/1000, minQuotaUsecs)
}

// OOMKills is how many processes the kernel's OOM killer ended in the
// container's cgroup since it was created (v2 memory.events oom_kill; v1
// memory.oom_control oom_kill, Linux 4.13 or later).
func (m *Manager) OOMKills(uid, name string) (uint64, error) {
	d, ok := m.dir(Memory, uid, name)
	if !ok {
		return 0, errNone
	}
	f := "memory.oom_control"
	if m.version == V2 {
		f = "memory.events"
	}
	kv, err := readKV(filepath.Join(d, f))
	if err != nil {
		return 0, err
	}
	n, ok := kv["oom_kill"]
	if !ok {
		return 0, fmt.Errorf("cgroups: %s has no oom_kill counter (Linux 4.13 or later has it)", filepath.Join(d, f))
	}
	return n, nil
}

// ContainerUsage reads a container's cgroup.
func (m *Manager) ContainerUsage(uid, name string) (Usage, error) {
	if err := checkName("container name", name); err != nil {
		return Usage{}, err
	}
	return m.usage(uid, name)
}

// PodUsage reads the pod's cgroup (every container, init and ephemeral
// ones included).
func (m *Manager) PodUsage(uid string) (Usage, error) { return m.usage(uid, "") }

func (m *Manager) usage(uid, name string) (Usage, error) {
	if m.version == None {
		return Usage{}, errNone
	}
	var u Usage
	if d, ok := m.dir(Memory, uid, name); ok {
		st, err := readKV(filepath.Join(d, "memory.stat"))
		if err != nil {
			return Usage{}, err
		}
		var cur uint64
		var inactive string
		if m.version == V2 {
			cur, err = readUint(filepath.Join(d, "memory.current"))
			inactive, u.RSSBytes = "inactive_file", st["anon"]
		} else {
			cur, err = readUint(filepath.Join(d, "memory.usage_in_bytes"))
			inactive, u.RSSBytes = "total_inactive_file", st["total_rss"]
		}
		if err != nil {
			return Usage{}, err
		}
		u.MemoryBytes, u.HasMemory = cur, true
		if in := st[inactive]; in < cur {
			u.WorkingSetBytes = cur - in
		}
	}
	if m.version == V2 {
		if d, ok := m.dir(CPU, uid, name); ok {
			st, err := readKV(filepath.Join(d, "cpu.stat"))
			if err != nil {
				return Usage{}, err
			}
			u.CPUNanos, u.HasCPU = st["usage_usec"]*1000, true
		}
	} else if d, ok := m.dir(CPUAcct, uid, name); ok {
		n, err := readUint(filepath.Join(d, "cpuacct.usage"))
		if err != nil {
			return Usage{}, err
		}
		u.CPUNanos, u.HasCPU = n, true
	}
	// Every hierarchy holds the same processes: the first one's count.
	if ds := m.uniqueDirs(); len(ds) > 0 {
		pids, err := procs(filepath.Join(ds[0], podName(uid), name))
		if err != nil {
			return Usage{}, err
		}
		u.Processes = uint32(len(pids))
	}
	return u, nil
}

// RemovePod kills every process left in the pod's cgroups (a daemonized
// child that left its container's process group, say) and removes them.
func (m *Manager) RemovePod(uid string) error {
	if m.version == None {
		return nil
	}
	if err := checkName("pod uid", uid); err != nil {
		return err
	}
	var errs []error
	for _, d := range m.PodDirs(uid) {
		errs = append(errs, removeTree(d))
	}
	return errors.Join(errs...)
}

// Remove kills every process in k3sm's subtree and removes it, pods
// included (the tests' clean-up). The v2 leaf the daemon moved to
// (LeafName) is not touched.
func (m *Manager) Remove() error {
	if m.version == None {
		return nil
	}
	var errs []error
	for _, d := range m.uniqueDirs() {
		errs = append(errs, removeTree(d))
	}
	return errors.Join(errs...)
}

// removeTree kills the processes of cgroup d and its children and removes
// them, children first. A missing d is not an error.
func removeTree(d string) error {
	ents, err := os.ReadDir(d)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeTree(filepath.Join(d, e.Name())); err != nil {
				return err
			}
		}
	}
	// cgroup.kill (v2, Linux 5.14) kills atomically, forks included;
	// elsewhere SIGKILL what is listed until nothing is left.
	if k := filepath.Join(d, "cgroup.kill"); exists(k) {
		writeFile(k, "1")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := procs(d)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(pids) == 0 {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				return nil
			}
			if !errors.Is(err, syscall.EBUSY) {
				return fmt.Errorf("cgroups: remove %s: %w", d, err)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroups: remove %s: processes %v are still in it after SIGKILL for 10s", d, pids)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// procs lists the pids in cgroup d.
func procs(d string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func writeFile(p, v string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", v, p, err)
	}
	return nil
}

func readUint(p string) (uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// readInt reads an integer file; unreadable or "max" is MaxInt64.
func readInt(p string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 1<<63 - 1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 1<<63 - 1
	}
	return n
}

// readKV parses "key value" lines (memory.stat, memory.events, cpu.stat,
// memory.oom_control).
func readKV(p string) (map[string]uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, nil
}

// FavorDynMods is the cgroup2 mount option (Linux 6.1+) that makes moving
// a process into a cgroup cheap. Without it the kernel's threadgroup lock
// waits for an RCU grace period on a write to cgroup.procs after a quiet
// moment: 6–12 ms on a 2-CPU machine, paid by every container start (its
// init joins its cgroups) and exec. With it, ~0.1 ms; fork and exit do a
// little more work instead. The lock is global: the option set on the
// cgroup2 hierarchy speeds up v1 hierarchies' moves as well.
const FavorDynMods = "favordynmods"

// AttachMode is the host's setting, from mountinfo: the first cgroup2
// mount, its superblock options, and whether FavorDynMods is among them.
type AttachMode struct {
	Mount   string   // "" when no cgroup2 hierarchy is mounted
	Options []string // superblock options, without rw/ro
	Favored bool
}

// Describe says what the mode means for pod starts.
func (a AttachMode) Describe() string {
	switch {
	case a.Mount == "":
		return "no cgroup2 hierarchy is mounted to carry " + FavorDynMods
	case a.Favored:
		return "cgroup2 " + FavorDynMods + " is set (" + a.Mount + "): moving a container's first process into its cgroups is cheap"
	}
	return "cgroup2 " + FavorDynMods + " is not set (" + a.Mount + "): each container start waits for an RCU grace period (~6–12 ms) to join its cgroups"
}
