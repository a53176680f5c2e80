package vm

import (
	"testing"
	"time"
)

// The cgroups package's kernel tests, which this build machine runs on v1,
// on v2: memory.max and the OOM kill read from memory.events, cpu.max
// holding a busy loop, pids.max stopping forks, usage from memory.current
// and cpu.stat, and nothing left behind.
var cgroupsKernelTests = []string{
	"TestDetectAgreesWithNew", "TestOOMKillWithin2s", "TestCPULimitHoldsBusyLoop",
	"TestUsageAndPidsLimit", "TestRemovePodLeavesNothing",
}

// As `k3sm install` runs the runtime: a system service with Delegate=yes,
// so the manager takes the subtree systemd handed it (moving itself to a
// leaf), not one beside systemd's.
func TestCgroupsV2DelegatedService(t *testing.T) {
	need(t)
	guestGoTest(t, 3*time.Minute,
		"systemd-run --wait --pipe --quiet --collect -p Delegate=yes -E K3SM_CGROUPS_TEST_STRICT_CPU=1 "+emulated("-E ")+
			"/mnt/k3sm/cgroups.test -test.v -test.count=1",
		append(cgroupsKernelTests, "TestV2SetupPlaces")...)
}

// Root without delegation (an ssh session's scope): a subtree of its own
// below the root of the hierarchy.
func TestCgroupsV2RootUndelegated(t *testing.T) {
	need(t)
	guestGoTest(t, 3*time.Minute, "cd /tmp && env "+emulated("")+"/mnt/k3sm/cgroups.test -test.v -test.count=1", cgroupsKernelTests...)
}
