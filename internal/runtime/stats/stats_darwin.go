//go:build darwin

package stats

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// processGroups sums proc_pid_rusage (physical footprint, CPU time) over
// each group's processes, listed with sysctl kern.proc.pgrp.<pgid>: what
// the memory sampler kills on and ListPodStats reports on darwin.
func processGroups(pgids []int) (map[int]Sample, error) {
	return sumGroups(pgids, groupPids, ProcessRusage)
}

func groupPids(pgid int) ([]int, error) {
	procs, err := unix.SysctlKinfoProcSlice("kern.proc.pgrp", pgid)
	if err != nil {
		return nil, fmt.Errorf("stats: sysctl kern.proc.pgrp.%d: %w", pgid, err)
	}
	pids := make([]int, 0, len(procs))
	for _, p := range procs {
		pids = append(pids, int(p.Proc.P_pid))
	}
	return pids, nil
}
