package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat starttime; it is 100
// on every Linux architecture Go supports.
const clockTicks = 100

// procStat is what the benchmark needs from /proc/<pid>/stat.
type procStat struct {
	ppid      int
	state     byte
	startTick int64 // since boot, in 1/clockTicks s
}

func readStat(pid int) (procStat, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// The command name may contain spaces and parentheses: fields start
	// after the last ')'.
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return procStat{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+2:])
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ppid, _ := strconv.Atoi(f[1])
	start, _ := strconv.ParseInt(f[19], 10, 64)
	return procStat{ppid: ppid, state: f[0][0], startTick: start}, nil
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	st, err := readStat(pid)
	return err == nil && st.state != 'Z' && st.state != 'X'
}

// tree returns root and all its live descendants, root first, then by pid.
func tree(root int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.state == 'Z' {
			continue
		}
		children[st.ppid] = append(children[st.ppid], pid)
	}
	if !alive(root) {
		return nil
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	sort.Ints(out[1:])
	return out
}

// cmdline returns the argv of pid.
func cmdline(pid int) ([]string, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00"), nil
}

// role names a k3sm process by its hidden role (argv[1]); the supervisor
// itself is "server". A helper binary of its own (k3sm-netd) is named by
// its executable, but k3sm-runtimed keeps its role's name "runtimed", as
// before it left the k3sm binary, so results stay comparable.
func role(pid int) string {
	args, err := cmdline(pid)
	if err != nil || len(args) < 2 {
		return "?"
	}
	if base := filepath.Base(args[0]); base == "k3sm-runtimed" {
		return "runtimed"
	} else if strings.HasPrefix(base, "k3sm-") {
		return base
	}
	return args[1]
}

// findRole returns the first process in pids whose role is r, or 0.
func findRole(pids []int, r string) int {
	for _, p := range pids {
		if role(p) == r {
			return p
		}
	}
	return 0
}

// memory is one process's line of /proc/<pid>/smaps_rollup, in kB.
type memory struct {
	Pid                 int
	Role                string
	RSS, PSS            int64
	PSSAnon, PSSFile    int64
	PrivateDirtyKB      int64
	HasPSSAnonBreakdown bool
}

func smapsRollup(pid int) (memory, error) {
	m := memory{Pid: pid, Role: role(pid)}
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return m, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		v, err := strconv.ParseInt(fs[1], 10, 64)
		if err != nil {
			continue
		}
		switch fs[0] {
		case "Rss:":
			m.RSS = v
		case "Pss:":
			m.PSS = v
		case "Pss_Anon:":
			m.PSSAnon, m.HasPSSAnonBreakdown = v, true
		case "Pss_File:":
			m.PSSFile = v
		case "Private_Dirty:":
			m.PrivateDirtyKB = v
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if m.RSS == 0 {
		return m, fmt.Errorf("/proc/%d/smaps_rollup: no Rss line", pid)
	}
	return m, nil
}

// sameFileMappers lists processes outside skip that run the executable
// exe: they share its pages and would lower the measured PSS.
func sameFileMappers(exe string, skip []int) []int {
	want, err := os.Stat(exe)
	if err != nil {
		return nil
	}
	in := map[int]bool{}
	for _, p := range skip {
		in[p] = true
	}
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || in[pid] {
			continue
		}
		fi, err := os.Stat(filepath.Join("/proc", e.Name(), "exe"))
		if err == nil && os.SameFile(fi, want) {
			out = append(out, pid)
		}
	}
	return out
}

// killGroup signals the process group led by pid.
func killGroup(pid int, sig syscall.Signal) {
	_ = syscall.Kill(-pid, sig)
}
