//go:build linux

package metrics

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// HostUsage reads the machine's CPU time (every non-idle mode of the "cpu"
// line of /proc/stat) and memory working set, defined as the kubelet does
// for the root cgroup: memory in use minus inactive file pages
// (MemTotal − MemFree − Inactive(file) from /proc/meminfo).
func HostUsage() (Usage, error) {
	t := time.Now()
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Usage{}, err
	}
	cpu, err := parseProcStat(stat)
	if err != nil {
		return Usage{}, err
	}
	mi, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return Usage{}, err
	}
	mem, err := parseMeminfo(mi)
	if err != nil {
		return Usage{}, err
	}
	return Usage{Time: t, CPUNanos: cpu, MemoryWorkingSet: mem}, nil
}

// userHZ is the tick of /proc/stat on every Linux architecture Go supports.
const userHZ = 100

func parseProcStat(b []byte) (uint64, error) {
	for line := range bytes.Lines(b) {
		f := bytes.Fields(line)
		if len(f) < 9 || string(f[0]) != "cpu" {
			continue
		}
		// user nice system idle iowait irq softirq steal [guest guest_nice];
		// guest time is already part of user.
		var busy uint64
		for i, v := range f[1:9] {
			if i == 3 || i == 4 { // idle, iowait
				continue
			}
			n, err := strconv.ParseUint(string(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/stat: %w", err)
			}
			busy += n
		}
		return busy * (1e9 / userHZ), nil
	}
	return 0, fmt.Errorf("/proc/stat: no cpu line")
}

func parseMeminfo(b []byte) (uint64, error) {
	vals := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			continue
		}
		vals[string(bytes.TrimSuffix(f[0], []byte(":")))] = n * 1024
	}
	total, ok1 := vals["MemTotal"]
	free, ok2 := vals["MemFree"]
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("/proc/meminfo: no MemTotal or MemFree")
	}
	used := total - free
	if inactive := vals["Inactive(file)"]; inactive < used {
		used -= inactive
	}
	return used, nil
}
