//go:build linux

package cgroups

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKubeletFormulas(t *testing.T) {
	for _, c := range []struct {
		millis int64
		shares uint64
		weight uint64
		quota  int64
	}{
		{0, 2, 1, 0},
		{1, 2, 1, 1000}, // quota floor: 1 ms per period
		{10, 10, 1, 1000},
		{100, 102, 4, 10000},
		{250, 256, 10, 25000},
		{1000, 1024, 39, 100000},
		{2000, 2048, 79, 200000},
		{1000000, 262144, 10000, 100000000},
	} {
		if got := CPUShares(c.millis); got != c.shares {
			t.Errorf("CPUShares(%d) = %d, want %d", c.millis, got, c.shares)
		}
		if got := CPUWeight(CPUShares(c.millis)); got != c.weight {
			t.Errorf("CPUWeight(shares(%d)) = %d, want %d", c.millis, got, c.weight)
		}
		if got := CPUQuota(c.millis); got != c.quota {
			t.Errorf("CPUQuota(%d) = %d, want %d", c.millis, got, c.quota)
		}
	}
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadLayout(t *testing.T) {
	// This project's machines: v1 controllers on their own hierarchies, an
	// empty unified hierarchy beside them.
	v1Info := writeTemp(t, "mountinfo", `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`)
	v1Self := writeTemp(t, "cgroup", "8:pids:/\n4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n")
	l, err := readLayout(v1Info, v1Self)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.v1[Memory]; got.own != "/sys/fs/cgroup/memory/process_api/abc" || got.rel != "/process_api/abc" {
		t.Errorf("memory: %+v", got)
	}
	if got := l.v1[CPU]; got.own != "/sys/fs/cgroup/cpu" || got.rel != "/" {
		t.Errorf("cpu: %+v", got)
	}
	if l.v2.mount != "/sys/fs/cgroup/unified" {
		t.Errorf("v2: %+v", l.v2)
	}

	// Co-mounted cpu,cpuacct under systemd, in a unit's cgroup.
	coInfo := writeTemp(t, "mountinfo", `30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
31 25 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
`)
	coSelf := writeTemp(t, "cgroup", "3:cpu,cpuacct:/system.slice/k3sm.service\n2:memory:/system.slice/k3sm.service\n")
	if l, err = readLayout(coInfo, coSelf); err != nil {
		t.Fatal(err)
	}
	if l.v1[CPU].own != l.v1[CPUAcct].own || l.v1[CPU].own != "/sys/fs/cgroup/cpu,cpuacct/system.slice/k3sm.service" {
		t.Errorf("co-mounted: cpu %+v cpuacct %+v", l.v1[CPU], l.v1[CPUAcct])
	}

	// v2 in a container: the hierarchy is mounted from the container's
	// cgroup, whose path /proc/self/cgroup shows in full without a cgroup
	// namespace.
	v2Info := writeTemp(t, "mountinfo", `700 690 0:30 /docker/ctr /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw,nsdelegate
`)
	v2Self := writeTemp(t, "cgroup", "0::/docker/ctr\n")
	if l, err = readLayout(v2Info, v2Self); err != nil {
		t.Fatal(err)
	}
	if l.v2.own != "/sys/fs/cgroup" || l.v2.rel != "/" || len(l.v1) != 0 {
		t.Errorf("v2 in a container: %+v v1 %v", l.v2, l.v1)
	}
	if got := unescape(`/mnt/with\040space`); got != "/mnt/with space" {
		t.Errorf("unescape: %q", got)
	}
}

// The setup against a host with no cgroup hierarchy in its mount
// namespace, and one whose hierarchies a later mount hides: no cgroups,
// the cause named, the fix given; creating nothing (New as Detect).
func TestSetupWithoutHierarchy(t *testing.T) {
	root := t.TempDir()
	self := writeTemp(t, "cgroup", "8:pids:/\n4:memory:/\n2:cpuacct:/\n1:cpu:/\n0::/\n")
	noCgroups := writeTemp(t, "mountinfo", "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n")
	for _, dry := range []bool{true, false} {
		s := setup(Options{}, host{mountinfo: noCgroups, self: self, cgroupRoot: root, euid: 0, visible: func(string) bool { return true }}, dry).Support()
		if s.Version != None || s.Cause != CauseNotMounted || !strings.Contains(s.Reason, root+" is empty") || !strings.Contains(s.Fix, "ip netns exec") {
			t.Errorf("dry %v, nothing mounted: %+v", dry, s)
		}
	}
	os.Remove(root)
	s := setup(Options{}, host{mountinfo: noCgroups, self: self, cgroupRoot: root, visible: func(string) bool { return true }}, true).Support()
	if !strings.Contains(s.Reason, root+" does not exist") {
		t.Errorf("no %s: %+v", root, s)
	}

	hidden := writeTemp(t, "mountinfo", `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
90 31 0:50 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw
`)
	s = setup(Options{}, host{mountinfo: hidden, self: self, cgroupRoot: "/sys/fs/cgroup", visible: func(string) bool { return false }}, false).Support()
	if s.Version != None || s.Cause != CauseNotMounted || !strings.Contains(s.Reason, "/sys/fs/cgroup/cpu, /sys/fs/cgroup/memory are hidden") {
		t.Errorf("hidden hierarchies: %+v", s)
	}
	if d := s.Describe(); !strings.HasPrefix(d, "no cgroups: ") {
		t.Errorf("Describe: %q", d)
	}
}

// fakeV2 lays out the interface files of a v2 cgroup in a temp directory,
// so the v2 setters and readers can be checked on a machine whose
// controllers are all on v1. Files are ordinary files here: what is
// checked is what the package writes and how it parses what it reads.
func fakeV2(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for f, v := range map[string]string{
		"memory.max": "max\n", "memory.swap.max": "max\n", "memory.oom.group": "0\n",
		"cpu.max": "max 100000\n", "cpu.weight": "100\n", "pids.max": "max\n",
		"memory.events":  "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 1\n",
		"memory.current": "104857600\n",
		"memory.stat":    "anon 73400320\nfile 31457280\nactive_file 10485760\ninactive_file 20971520\n",
		"cpu.stat":       "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
		"cgroup.procs":   "10\n11\n12\n",
	} {
		if err := os.WriteFile(filepath.Join(d, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestV2Files(t *testing.T) {
	d := fakeV2(t)
	m := &Manager{version: V2}
	if err := m.setMemory(d, 32<<20, true); err != nil {
		t.Fatal(err)
	}
	if err := m.setCPU(d, 100, 250); err != nil {
		t.Fatal(err)
	}
	if err := m.setPids(d, 4096); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"memory.max": "33554432", "memory.swap.max": "0", "memory.oom.group": "1",
		"cpu.max": "10000 100000", "cpu.weight": "10", "pids.max": "4096"} {
		if got := read(t, filepath.Join(d, f)); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	// Unset limits.
	if err := m.setMemory(d, 0, false); err != nil {
		t.Fatal(err)
	}
	m.setCPU(d, 0, 0)
	m.setPids(d, 0)
	for f, want := range map[string]string{"memory.max": "max", "cpu.max": "max 100000", "cpu.weight": "1", "pids.max": "max"} {
		if got := read(t, filepath.Join(d, f)); got != want {
			t.Errorf("unset: %s = %q, want %q", f, got, want)
		}
	}

	// Reading back, with d as <subtree>/pod<uid>/<name>.
	sub := t.TempDir()
	c := filepath.Join(sub, "podu1", "main")
	os.MkdirAll(filepath.Dir(c), 0o755)
	if err := os.Rename(d, c); err != nil {
		t.Fatal(err)
	}
	m.dirs = map[string]string{Memory: sub, CPU: sub, Pids: sub}
	n, err := m.OOMKills("u1", "main")
	if err != nil || n != 2 {
		t.Fatalf("OOMKills = %d, %v; want 2", n, err)
	}
	u, err := m.ContainerUsage("u1", "main")
	if err != nil {
		t.Fatal(err)
	}
	want := Usage{CPUNanos: 1500000000, MemoryBytes: 104857600, WorkingSetBytes: 104857600 - 20971520, RSSBytes: 73400320, Processes: 3, HasMemory: true, HasCPU: true}
	if u != want {
		t.Errorf("usage %+v, want %+v", u, want)
	}
	if got := m.ContainerDirs("u1", "main"); len(got) != 1 || got[0] != c {
		t.Errorf("ContainerDirs = %v, want [%s]", got, c)
	}
}

func TestV1MemswOrder(t *testing.T) {
	// Both files get the limit. Ordinary files accept any order: the
	// kernel's refusal of a wrong one is TestV1MemswOrderOnKernel's.
	d := t.TempDir()
	os.WriteFile(filepath.Join(d, "memory.limit_in_bytes"), []byte("9223372036854771712\n"), 0o644)
	os.WriteFile(filepath.Join(d, "memory.memsw.limit_in_bytes"), []byte("9223372036854771712\n"), 0o644)
	m := &Manager{version: V1}
	if err := m.setMemory(d, 32<<20, true); err != nil {
		t.Fatal(err)
	}
	if a, b := read(t, filepath.Join(d, "memory.limit_in_bytes")), read(t, filepath.Join(d, "memory.memsw.limit_in_bytes")); a != "33554432" || b != "33554432" {
		t.Errorf("limit %s memsw %s", a, b)
	}
}

func TestBadNames(t *testing.T) {
	m := &Manager{version: V1, dirs: map[string]string{Memory: t.TempDir()}}
	if _, err := m.NewContainer("u1", "../x", Resources{}); err == nil || !strings.Contains(err.Error(), "container name") {
		t.Errorf("NewContainer with a slash: %v", err)
	}
	if err := m.SetPod("a/b", Resources{}); err == nil || !strings.Contains(err.Error(), "pod uid") {
		t.Errorf("SetPod with a slash: %v", err)
	}
	var none Manager
	if err := none.SetPod("u", Resources{}); err == nil {
		t.Error("SetPod without cgroups succeeded")
	}
	var nilManager *Manager
	if nilManager.Version() != None || nilManager.Has(Memory) {
		t.Error("a nil Manager is not None")
	}
	if !strings.Contains((&Manager{reason: "why"}).Describe(), "why") {
		t.Error("Describe of None does not say why")
	}
}
