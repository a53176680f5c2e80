package imagetest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// PidNSSuffix is appended to an `echo $!` in a test's shell command so the
// pid file also names the pid namespace: `echo $! ` + PidNSSuffix.
const PidNSSuffix = "$(readlink /proc/self/ns/pid)"

// HostPid turns what a pid file holds ("<pid> pid:[<inode>]", written by
// the pid: op or an echo with PidNSSuffix) into the pid on the host: a
// sandboxed pod has a pid namespace of its own, where its main process is
// 1. A file with only a pid is a host pid.
func HostPid(content string) (int, error) {
	f := strings.Fields(content)
	if len(f) == 0 {
		return 0, fmt.Errorf("empty pid file")
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, fmt.Errorf("pid file %q: %w", content, err)
	}
	own, _ := os.Readlink("/proc/self/ns/pid")
	if len(f) < 2 || f[1] == own {
		return pid, nil
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if ns, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err != nil || ns != f[1] {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				ids := strings.Fields(v)
				if len(ids) > 1 && ids[len(ids)-1] == f[0] {
					return strconv.Atoi(ids[0])
				}
			}
		}
	}
	return 0, fmt.Errorf("no process %d in %s (it ended)", pid, f[1])
}
