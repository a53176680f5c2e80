//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// proc is one process found under /proc.
type proc struct {
	Pid, PPid int
	Exe       string   // target of /proc/<pid>/exe
	Args      []string // cmdline
	Role      string
	PSS, RSS  int64 // kB, from smaps_rollup (readMems)
}

// scan lists the live processes.
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
		ppid, state, err := parseStat(string(stat))
		if err != nil || state == "Z" {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		raw, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		out = append(out, proc{Pid: pid, PPid: ppid, Exe: exe, Args: args, Role: role(exe, args)})
	}
	return out
}

// parseStat returns the parent pid and state from the text of
// /proc/<pid>/stat (the command name in parentheses may hold spaces and
// parentheses).
func parseStat(stat string) (ppid int, state string, err error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, "", fmt.Errorf("malformed stat")
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 {
		return 0, "", fmt.Errorf("malformed stat")
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0], err
}

// role names a process as the report does: "k3sm <role>" for the k3sm
// binary (k3sm agent, k3sm node, k3sm server), else its program's name.
func role(exe string, args []string) string {
	name := filepath.Base(strings.TrimSuffix(exe, " (deleted)"))
	if exe == "" && len(args) > 0 {
		name = filepath.Base(args[0])
	}
	if name == "k3sm" && len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		return "k3sm " + args[1]
	}
	return name
}

// tree returns root and all its descendants, in all's order.
func tree(all []proc, root int) []proc {
	children := map[int][]int{}
	for _, p := range all {
		children[p.PPid] = append(children[p.PPid], p.Pid)
	}
	in := map[int]bool{}
	stack := []int{root}
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if !in[pid] {
			in[pid] = true
			stack = append(stack, children[pid]...)
		}
	}
	var out []proc
	for _, p := range all {
		if in[p.Pid] {
			out = append(out, p)
		}
	}
	return out
}

// readMems fills in PSS and RSS; a process gone meanwhile is dropped.
func readMems(ps []proc) []proc {
	var out []proc
	for _, p := range ps {
		f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", p.Pid))
		if err != nil {
			logf("pid %d (%s): %v", p.Pid, p.Role, err)
			continue
		}
		p.PSS, p.RSS, err = parseSmapsRollup(f)
		f.Close()
		if err != nil {
			logf("pid %d (%s): smaps_rollup: %v", p.Pid, p.Role, err)
			continue
		}
		out = append(out, p)
	}
	return out
}

// parseSmapsRollup reads the Pss: and Rss: totals (kB).
func parseSmapsRollup(r io.Reader) (pss, rss int64, err error) {
	var havePSS, haveRSS bool
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
		case "Pss:":
			pss, havePSS = v, true
		case "Rss:":
			rss, haveRSS = v, true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if !havePSS || !haveRSS {
		return 0, 0, fmt.Errorf("no Pss: or Rss: line")
	}
	return pss, rss, nil
}
