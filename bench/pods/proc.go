package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// proc is one process found under /proc.
type proc struct {
	Pid, PPid int
	Exe       string        // target of /proc/<pid>/exe
	Args      []string      // cmdline
	Role      string        // k3sm role (server, kube-apiserver, runtimed, node, ...), "k3sm-shim" or "workload"
	CPU       time.Duration // time on a CPU, all live threads
	ChildCPU  time.Duration // CPU time of its children that exited and were waited for
}

// clockTicks is USER_HZ, the unit of CPU times in /proc/<pid>/stat (100 on
// every Linux architecture Go supports).
const clockTicks = 100

// cpuTime is the time pid's threads spent on a CPU: the sum of their
// /proc/<pid>/task/<tid>/schedstat (nanoseconds, so a short-lived shim's
// few milliseconds count), or the 10 ms ticks of /proc/<pid>/stat where
// schedstat cannot be read.
func cpuTime(pid int, ticks int64) time.Duration {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return time.Duration(ticks) * time.Second / clockTicks
	}
	var ns int64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			return time.Duration(ticks) * time.Second / clockTicks
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return time.Duration(ticks) * time.Second / clockTicks
		}
		ns += v
	}
	return time.Duration(ns)
}

// mem is what smaps_rollup says about a process, in kB.
type mem struct {
	RSS, PSS, PSSAnon, PSSFile int64
}

func (m mem) add(o mem) mem {
	return mem{m.RSS + o.RSS, m.PSS + o.PSS, m.PSSAnon + o.PSSAnon, m.PSSFile + o.PSSFile}
}

// parseSmapsRollup reads the totals of /proc/<pid>/smaps_rollup.
func parseSmapsRollup(r io.Reader) (mem, error) {
	var m mem
	found := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "Rss:":
			m.RSS, found = v, true
		case "Pss:":
			m.PSS = v
		case "Pss_Anon:":
			m.PSSAnon = v
		case "Pss_File:":
			m.PSSFile = v
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if !found {
		return m, fmt.Errorf("no Rss line")
	}
	return m, nil
}

func readMem(pid int) (mem, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return mem{}, err
	}
	defer f.Close()
	return parseSmapsRollup(f)
}

// parseStat returns the parent pid, state and user+system CPU ticks from
// the text of /proc/<pid>/stat (the command name in parentheses may hold
// spaces and parentheses).
func parseStat(stat string) (ppid int, state string, ticks int64, err error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, "", 0, fmt.Errorf("malformed stat")
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, "", 0, fmt.Errorf("malformed stat")
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return 0, "", 0, err
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, "", 0, fmt.Errorf("malformed stat times")
	}
	return ppid, f[0], utime + stime, nil
}

// childTicks returns cutime+cstime from the text of /proc/<pid>/stat: the
// CPU time of children the process has waited for (0 when malformed).
func childTicks(stat string) int64 {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 15 {
		return 0
	}
	cu, err1 := strconv.ParseInt(f[13], 10, 64)
	cs, err2 := strconv.ParseInt(f[14], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return cu + cs
}

// scan lists live (non-zombie) processes.
func scan() []proc {
	entries, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		ppid, state, ticks, err := parseStat(string(stat))
		if err != nil || state == "Z" {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		raw, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		out = append(out, proc{Pid: pid, PPid: ppid, Exe: exe, Args: args, CPU: cpuTime(pid, ticks),
			ChildCPU: time.Duration(childTicks(string(stat))) * time.Second / clockTicks})
	}
	return out
}

// classify names the processes of one k3sm server: its process tree under
// serverPid (k3sm roles by their first argument, k3sm-runtimed as
// "runtimed"), every process running
// shimPath, and every process whose executable lies in the data dir's pod
// roots. Anything else is dropped.
func classify(all []proc, serverPid int, bin, shimPath, dataDir string) []proc {
	children := map[int][]int{}
	byPid := map[int]proc{}
	for _, p := range all {
		children[p.PPid] = append(children[p.PPid], p.Pid)
		byPid[p.Pid] = p
	}
	inTree := map[int]bool{}
	stack := []int{serverPid}
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if _, ok := byPid[pid]; !ok || inTree[pid] {
			continue
		}
		inTree[pid] = true
		stack = append(stack, children[pid]...)
	}
	podRoots := filepath.Join(dataDir, "pods") + string(filepath.Separator)
	isShim := func(p proc) bool {
		return p.Exe == shimPath && len(p.Args) > 1 && strings.HasPrefix(p.Args[1], dataDir+string(filepath.Separator))
	}
	// underShim: a sandboxed workload's executable is a path of its own
	// root (/app/prog), so it is known by its ancestor, this server's shim.
	underShim := func(p proc) bool {
		for seen := 0; seen < 64; seen++ {
			parent, ok := byPid[p.PPid]
			if !ok {
				return false
			}
			if isShim(parent) {
				return true
			}
			p = parent
		}
		return false
	}
	var out []proc
	for _, p := range all {
		switch {
		case isShim(p):
			p.Role = "k3sm-shim"
		case strings.HasPrefix(p.Exe, podRoots) || underShim(p):
			p.Role = "workload"
		case inTree[p.Pid] && p.Exe == bin && len(p.Args) > 1:
			p.Role = p.Args[1]
		case inTree[p.Pid] && filepath.Base(p.Exe) == "k3sm-runtimed":
			// Named by its role, as when it was one of k3sm's.
			p.Role = "runtimed"
		case inTree[p.Pid]:
			p.Role = filepath.Base(p.Exe)
		default:
			continue
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}

func countRole(ps []proc, role string) int {
	n := 0
	for _, p := range ps {
		if p.Role == role {
			n++
		}
	}
	return n
}

// reapedRole is the CPU of short-lived processes (runc, `shim start`,
// mount helpers) that exited and were waited for by a measured process:
// gone from /proc, but in their parent's cutime and cstime.
const reapedRole = "exited children (waited for by the above)"

// cpuByRole sums the CPU time of one server's processes by role; "bench"
// is this program.
func cpuByRole(ps []proc) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, p := range ps {
		out[p.Role] += p.CPU
		out[reapedRole] += p.ChildCPU
	}
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		if _, _, t, err := parseStat(string(b)); err == nil {
			out["bench"] = cpuTime(os.Getpid(), t)
		}
	}
	return out
}
