//go:build linux

package pressure

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseMeminfo(t *testing.T) {
	m, err := parseMeminfo([]byte("MemTotal:       24683584 kB\nMemFree:        12533104 kB\nMemAvailable:   23821844 kB\n"))
	if err != nil || m.total != 24683584*1024 || m.free != 12533104*1024 || m.available != 23821844*1024 {
		t.Errorf("%+v %v", m, err)
	}
	if _, err := parseMeminfo([]byte("MemTotal: 1 kB\nMemFree: 1 kB\n")); err == nil || !strings.Contains(err.Error(), "MemAvailable") {
		t.Errorf("without MemAvailable: %v", err)
	}
}

// The kubelet's arithmetic: capacity less (usage − inactive_file), the
// working set never below zero and available never above capacity.
func TestWorkingSetSignal(t *testing.T) {
	for _, c := range []struct{ total, usage, inactive, want uint64 }{
		{8 << 30, 3 << 30, 1 << 30, 6 << 30},
		{8 << 30, 1 << 30, 2 << 30, 8 << 30},
		{8 << 30, 9 << 30, 0, 0},
	} {
		if got := workingSetSignal(c.total, c.usage, c.inactive, "x").AvailableBytes; got != c.want {
			t.Errorf("%+v: %d", c, got)
		}
	}
}

// A v1 memory hierarchy laid out in a directory (not a cgroup2 mount):
// usage_in_bytes and total_inactive_file, not the container's own
// inactive_file.
func TestFromRootCgroupV1Files(t *testing.T) {
	root := t.TempDir()
	mem := filepath.Join(root, "memory")
	os.Mkdir(mem, 0o755)
	os.WriteFile(filepath.Join(mem, "memory.usage_in_bytes"), []byte("3221225472\n"), 0o644)
	os.WriteFile(filepath.Join(mem, "memory.stat"), []byte("inactive_file 5\ntotal_inactive_file 1073741824\n"), 0o644)
	m, err := fromRootCgroup(root, meminfo{total: 8 << 30, free: 1 << 30, available: 7 << 30})
	if err != nil || m.AvailableBytes != 6<<30 || !strings.Contains(m.Source, "cgroup v1") {
		t.Errorf("%+v %v", m, err)
	}
	os.WriteFile(filepath.Join(mem, "memory.stat"), []byte("inactive_file 5\n"), 0o644)
	if _, err := fromRootCgroup(root, meminfo{total: 8 << 30}); err == nil || !strings.Contains(err.Error(), "total_inactive_file") {
		t.Errorf("without total_inactive_file: %v", err)
	}
	if _, err := fromRootCgroup(filepath.Join(root, "none"), meminfo{}); err == nil {
		t.Error("no hierarchy: no error")
	}
}

// This machine's signal, from its own root cgroup: plausible, and within
// what the kernel itself estimates can be had (MemAvailable counts
// reclaimable slab and active file pages the kubelet does not).
func TestReadMemory(t *testing.T) {
	m, err := ReadMemory()
	if err != nil {
		t.Fatal(err)
	}
	if m.TotalBytes < 64<<20 || m.AvailableBytes == 0 || m.AvailableBytes > m.TotalBytes || m.Source == "" {
		t.Errorf("implausible: %+v", m)
	}
	b, _ := os.ReadFile("/proc/meminfo")
	mi, err := parseMeminfo(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memory.available %d MiB of %d MiB (%s); MemAvailable %d MiB, MemFree %d MiB",
		m.AvailableBytes>>20, m.TotalBytes>>20, m.Source, mi.available>>20, mi.free>>20)
}
