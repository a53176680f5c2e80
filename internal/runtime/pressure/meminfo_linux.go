//go:build linux

package pressure

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where the cgroup hierarchies are mounted.
var cgroupRoot = "/sys/fs/cgroup"

// readMemory is memory.available as the kubelet computes it: the machine's
// memory (MemTotal) less the root cgroup's working set, its usage less its
// inactive file pages. On cgroup v2 the root has no memory.current, so its
// usage is MemTotal − MemFree from /proc/meminfo (as runc emulates it for
// cAdvisor) and inactive_file comes from the root's memory.stat; on v1 both
// come from the memory hierarchy's root. Where neither can be read (no
// cgroup filesystem mounted) it is the kernel's MemAvailable, and Source
// says so.
func readMemory() (Memory, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return Memory{}, err
	}
	mi, err := parseMeminfo(b)
	if err != nil {
		return Memory{}, err
	}
	m, err := fromRootCgroup(cgroupRoot, mi)
	if err != nil {
		return Memory{AvailableBytes: mi.available, TotalBytes: mi.total,
			Source: "MemAvailable from /proc/meminfo (the root cgroup's working set cannot be read: " + err.Error() + ")"}, nil
	}
	return m, nil
}

// meminfo is what of /proc/meminfo the signal uses, in bytes.
type meminfo struct{ total, free, available uint64 }

func parseMeminfo(b []byte) (meminfo, error) {
	var m meminfo
	var have int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		var dst *uint64
		switch string(f[0]) {
		case "MemTotal:":
			dst = &m.total
		case "MemFree:":
			dst = &m.free
		case "MemAvailable:":
			dst = &m.available
		default:
			continue
		}
		kb, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			return meminfo{}, fmt.Errorf("/proc/meminfo: %s %q: %v", f[0], f[1], err)
		}
		*dst = kb * 1024
		have++
	}
	if have < 3 {
		return meminfo{}, fmt.Errorf("/proc/meminfo lacks MemTotal, MemFree or MemAvailable (Linux 3.14 or later reports all three)")
	}
	return m, nil
}

// fromRootCgroup computes the signal from the root cgroup under root: the
// unified hierarchy when root is a cgroup2 mount, else v1's memory
// hierarchy.
func fromRootCgroup(root string, mi meminfo) (Memory, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return Memory{}, err
	}
	var usage, inactive uint64
	var src string
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		stat, err := os.ReadFile(filepath.Join(root, "memory.stat"))
		if err != nil {
			return Memory{}, err
		}
		if inactive, err = statField(stat, "inactive_file"); err != nil {
			return Memory{}, fmt.Errorf("%s/memory.stat: %w", root, err)
		}
		usage = mi.total - mi.free
		src = "cgroup v2: MemTotal − (MemTotal − MemFree − inactive_file of " + root + "/memory.stat)"
	} else {
		dir := filepath.Join(root, "memory")
		b, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
		if err != nil {
			return Memory{}, err
		}
		if usage, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return Memory{}, fmt.Errorf("%s/memory.usage_in_bytes: %w", dir, err)
		}
		stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
		if err != nil {
			return Memory{}, err
		}
		if inactive, err = statField(stat, "total_inactive_file"); err != nil {
			return Memory{}, fmt.Errorf("%s/memory.stat: %w", dir, err)
		}
		src = "cgroup v1: MemTotal − (memory.usage_in_bytes − total_inactive_file of " + dir + ")"
	}
	return workingSetSignal(mi.total, usage, inactive, src), nil
}

// workingSetSignal is capacity less the working set (usage less inactive
// file pages, never below zero), as cAdvisor and the kubelet compute it.
func workingSetSignal(total, usage, inactive uint64, src string) Memory {
	ws := uint64(0)
	if usage > inactive {
		ws = usage - inactive
	}
	avail := uint64(0)
	if total > ws {
		avail = total - ws
	}
	return Memory{AvailableBytes: avail, TotalBytes: total, Source: src}
}

// statField is a field of a memory.stat file.
func statField(b []byte, name string) (uint64, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == name {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errors.New("no " + name)
}
