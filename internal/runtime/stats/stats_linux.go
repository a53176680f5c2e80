//go:build linux

package stats

import (
	"bytes"
	"os"
	"strconv"
)

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

func processGroups(pgids []int) (map[int]Sample, error) {
	want := map[int]bool{}
	for _, g := range pgids {
		want[g] = true
	}
	out := map[int]Sample{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	page := uint64(os.Getpagesize())
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		pgrp, ticks, rss, ok := parseStat(b)
		if !ok || !want[pgrp] {
			continue
		}
		s := out[pgrp]
		s.CPUNanos += ticks * (1e9 / clockTicks)
		s.RSSBytes += rss * page
		s.WorkingSetBytes = s.RSSBytes
		s.Processes++
		out[pgrp] = s
	}
	return out, nil
}

// parseStat reads pgrp (field 5), utime+stime (14, 15) and rss (24) from
// /proc/<pid>/stat; the command name (field 2) may contain spaces.
func parseStat(b []byte) (pgrp int, ticks, rss uint64, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	if len(f) < 22 {
		return 0, 0, 0, false
	}
	g, err1 := strconv.Atoi(string(f[2]))
	ut, err2 := strconv.ParseUint(string(f[11]), 10, 64)
	st, err3 := strconv.ParseUint(string(f[12]), 10, 64)
	r, err4 := strconv.ParseInt(string(f[21]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return 0, 0, 0, false
	}
	if r < 0 {
		r = 0
	}
	return g, ut + st, uint64(r), true
}
