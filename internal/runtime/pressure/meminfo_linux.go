//go:build linux

package pressure

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// readMemory takes MemAvailable (the kernel's estimate of what can be
// allocated without swapping: free memory plus reclaimable page cache and
// slab) and MemTotal from /proc/meminfo.
func readMemory() (Memory, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return Memory{}, err
	}
	return parseMeminfo(b)
}

func parseMeminfo(b []byte) (Memory, error) {
	var m Memory
	var haveAvail, haveTotal bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		var dst *uint64
		switch string(f[0]) {
		case "MemAvailable:":
			dst, haveAvail = &m.AvailableBytes, true
		case "MemTotal:":
			dst, haveTotal = &m.TotalBytes, true
		default:
			continue
		}
		kb, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("/proc/meminfo: %s %q: %v", f[0], f[1], err)
		}
		*dst = kb * 1024
	}
	if !haveAvail || !haveTotal {
		return Memory{}, fmt.Errorf("/proc/meminfo has no MemAvailable or MemTotal (Linux 3.14 or later reports both)")
	}
	return m, nil
}
