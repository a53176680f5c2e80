// Package stats samples the CPU time and memory of a container for
// ListPodStats (kubectl top, /stats/summary): from its cgroup where it has
// one, else summed over its process group: from /proc on Linux, with
// proc_pid_rusage over sysctl kern.proc.pgrp's list on darwin.
package stats

import (
	"errors"

	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
)

// Sample is one reading for a container.
type Sample struct {
	// CPU time (user+system) in ns: of the cgroup since the attempt
	// started, or of the group's live processes.
	CPUNanos uint64
	// Resident set size, in bytes (a cgroup's anonymous memory).
	RSSBytes uint64
	// WorkingSetBytes is the cgroup's usage minus its inactive file pages,
	// as the kubelet reports it; without a cgroup, the RSS.
	WorkingSetBytes uint64
	Processes       uint32
}

// Cgroup reads a container's cgroup (m may be nil), taking from fallback,
// the process-group sample, what the cgroups do not provide; fallback is
// called only then. ok is false when there is no cgroup to read: then the
// result is fallback's.
func Cgroup(m *cgroups.Manager, podUID, container string, fallback func() Sample) (s Sample, ok bool) {
	if m.Version() == cgroups.None {
		return fallback(), false
	}
	u, err := m.ContainerUsage(podUID, container)
	if err != nil {
		return fallback(), false
	}
	if !u.HasMemory || !u.HasCPU {
		s = fallback()
	}
	if u.HasMemory {
		s.RSSBytes, s.WorkingSetBytes = u.RSSBytes, u.WorkingSetBytes
	}
	if u.HasCPU {
		s.CPUNanos = u.CPUNanos
	}
	s.Processes = u.Processes
	return s, true
}

// ErrUnsupported is returned where sampling is not implemented.
var ErrUnsupported = errors.New("stats: not supported on this platform")

// ProcessGroups samples every process group in pgids in one pass.
func ProcessGroups(pgids []int) (map[int]Sample, error) { return processGroups(pgids) }
