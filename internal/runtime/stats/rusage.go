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
