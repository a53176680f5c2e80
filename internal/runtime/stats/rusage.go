package stats

import "math/bits"

// The darwin process sampler's arithmetic and layout (rusage_darwin.go),
// OS-independent so that they are tested everywhere.

// rusageInfoV2 is struct rusage_info_v2 of <sys/resource.h>, field for
// field (RUSAGE_INFO_V2 has been stable since macOS 10.10).
type rusageInfoV2 struct {
	UUID                [16]byte
	UserTime            uint64 // Mach absolute time units, not ns
	SystemTime          uint64
	PkgIdleWkups        uint64
	InterruptWkups      uint64
	Pageins             uint64
	WiredSize           uint64
	ResidentSize        uint64
	PhysFootprint       uint64 // what Activity Monitor and jetsam count as the process's memory
	ProcStartAbstime    uint64
	ProcExitAbstime     uint64
	ChildUserTime       uint64
	ChildSystemTime     uint64
	ChildPkgIdleWkups   uint64
	ChildInterruptWkups uint64
	ChildPageins        uint64
	ChildElapsedAbstime uint64
	DiskioBytesread     uint64
	DiskioByteswritten  uint64
}

// ticksToNanos converts Mach ticks at hz to ns without overflowing the
// intermediate product (a 24 MHz clock overflows ticks*1e9 after 12 min).
func ticksToNanos(ticks, hz uint64) uint64 {
	hi, lo := bits.Mul64(ticks, 1_000_000_000)
	if hi >= hz {
		return ^uint64(0) // beyond 584 years of CPU
	}
	q, _ := bits.Div64(hi, lo, hz)
	return q
}

// sumGroups samples each process group in pgids: list gives a group's
// processes, read one process's footprint and CPU time. A process that
// exits between the two is left out; a group that cannot be listed fails
// the whole reading (the caller then enforces nothing rather than
// something wrong).
func sumGroups(pgids []int, list func(pgid int) ([]int, error), read func(pid int) (footprint, cpuNanos uint64, err error)) (map[int]Sample, error) {
	out := make(map[int]Sample, len(pgids))
	for _, g := range pgids {
		pids, err := list(g)
		if err != nil {
			return nil, err
		}
		var s Sample
		for _, pid := range pids {
			mem, cpu, err := read(pid)
			if err != nil {
				continue // exited meanwhile
			}
			s.RSSBytes += mem
			s.CPUNanos += cpu
			s.Processes++
		}
		if s.Processes == 0 {
			continue // the group is gone, as on Linux
		}
		s.WorkingSetBytes = s.RSSBytes
		out[g] = s
	}
	return out, nil
}
