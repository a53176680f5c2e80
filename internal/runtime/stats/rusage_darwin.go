package stats

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// proc_pid_rusage(3) is libproc's wrapper of the proc_info system call;
// with CGO_ENABLED=0 there is no libproc, so the call is made directly.
const (
	procInfoCallPIDRusage = 9 // PROC_INFO_CALL_PIDRUSAGE, <sys/proc_info.h>
	rusageInfoFlavorV2    = 2 // RUSAGE_INFO_V2
)

// ProcessRusage reads one process's physical footprint (bytes) and CPU
// time (user+system, ns) with proc_pid_rusage(RUSAGE_INFO_V2): what the
// darwin process-group sampler sums (processGroups). It answers for
// processes of the caller's own user (every pod's, on darwin) or, as root,
// any.
func ProcessRusage(pid int) (footprintBytes uint64, cpuNanos uint64, err error) {
	if pid <= 0 {
		return 0, 0, fmt.Errorf("stats: pid %d names no process", pid)
	}
	var ri rusageInfoV2
	_, _, errno := unix.Syscall6(unix.SYS_PROC_INFO, procInfoCallPIDRusage, uintptr(pid),
		rusageInfoFlavorV2, 0, uintptr(unsafe.Pointer(&ri)), 0)
	if errno != 0 {
		return 0, 0, fmt.Errorf("stats: proc_pid_rusage of pid %d: %w", pid, errno)
	}
	freq, err := timebaseFrequency()
	if err != nil {
		return 0, 0, err
	}
	return ri.PhysFootprint, ticksToNanos(ri.UserTime+ri.SystemTime, freq), nil
}

// timebaseFrequency is the Mach absolute clock's rate (hw.tbfrequency, a
// 64-bit sysctl): 24 MHz on Apple silicon, 1 GHz on Intel, where ticks are
// nanoseconds. Read once.
var timebaseFrequency = sync.OnceValues(func() (uint64, error) {
	hz, err := unix.SysctlUint64("hw.tbfrequency")
	if err != nil {
		return 0, fmt.Errorf("stats: sysctl hw.tbfrequency: %w", err)
	}
	if hz == 0 {
		return 0, fmt.Errorf("stats: sysctl hw.tbfrequency is 0")
	}
	return hz, nil
})
