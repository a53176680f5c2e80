// Package stats samples the CPU time and memory of a container's process
// group for ListPodStats: from /proc on Linux; on darwin a seam that
// compiles (proc_pid_rusage comes with the resource sampler on the roadmap).
package stats

import "errors"

// Sample is one reading for a process group.
type Sample struct {
	// CPU time (user+system) of the group's live processes, in ns.
	CPUNanos uint64
	// Resident set size of the group's processes, in bytes. Without
	// per-container cgroups this is the working set we report.
	RSSBytes  uint64
	Processes uint32
}

// ErrUnsupported is returned where sampling is not implemented.
var ErrUnsupported = errors.New("stats: not supported on this platform")

// ProcessGroups samples every process group in pgids in one pass.
func ProcessGroups(pgids []int) (map[int]Sample, error) { return processGroups(pgids) }
