package vm

import (
	"testing"
	"time"
)

// The runtime daemon on v2 under a delegated service: a container over
// its memory limit is OOM-killed by the kernel and reported OOMKilled with
// exit 137 (from memory.events), and its stats come from the v2 files.
func TestRuntimeDaemonV2(t *testing.T) {
	need(t)
	guestGoTest(t, 4*time.Minute,
		"systemd-run --wait --pipe --quiet --collect -p Delegate=yes "+
			"-E K3SM_RUNTIME_TEST_SHIM_BIN=/mnt/k3sm/k3sm-shim -E K3SM_RUNTIME_TEST_PROG_BIN=/mnt/k3sm/prog "+
			"/mnt/k3sm/daemon.test -test.v -test.count=1 -test.run 'TestIntegration(OOMKilledByCgroup|StatsFromCgroups)$'",
		"TestIntegrationOOMKilledByCgroup", "TestIntegrationStatsFromCgroups")
}
