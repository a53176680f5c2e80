package install

import (
	"bufio"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// leftoverProcesses are the processes still in the unit's cgroup (the
// pods: KillMode=process leaves them there), any hierarchy.
func leftoverProcesses(unit string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "cgroup"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasSuffix(line, "/"+unit) || strings.Contains(line, "/"+unit+"/") {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// purge removes the data dir, first unmounting what is mounted below it
// (the pods' network namespace files netd binds there), deepest first.
func purge(dir string) error {
	dir = filepath.Clean(dir)
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		var mounts []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) > 4 {
				mp := unescapeMount(fields[4])
				if strings.HasPrefix(mp, dir+"/") {
					mounts = append(mounts, mp)
				}
			}
		}
		f.Close()
		sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
		for _, mp := range mounts {
			_ = syscall.Unmount(mp, syscall.MNT_DETACH)
		}
	}
	return os.RemoveAll(dir)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
