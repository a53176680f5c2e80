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

// The rootless runtime under systemd user delegation: an unprivileged
// user with a user manager (lingering) runs the daemon in a unit of its
// own with Delegate=yes, and the kernel enforces the pods' limits there.
func TestRuntimeRootlessUserDelegation(t *testing.T) {
	need(t)
	guestGoTest(t, 4*time.Minute, "set -e\n"+userManager+`echo "user@$uid.service delegates: $(cat /sys/fs/cgroup/user.slice/user-$uid.slice/user@$uid.service/cgroup.controllers)" >&2
cd /tmp
`+asUser+`systemd-run --user --wait --pipe --quiet --collect -p Delegate=yes \
  -E K3SM_RUNTIME_TEST_SHIM_BIN=/mnt/k3sm/k3sm-shim -E K3SM_RUNTIME_TEST_PROG_BIN=/mnt/k3sm/prog \
  /mnt/k3sm/daemon.test -test.v -test.count=1 -test.run 'TestIntegrationRootlessUserDelegation$'`,
		"TestIntegrationRootlessUserDelegation")
	// The same user from root's ssh session (a scope systemd did not
	// delegate): no cgroups, said with the fix.
	guestGoTest(t, 2*time.Minute, `cd /tmp && runuser -u k3smtest -- env `+
		`K3SM_RUNTIME_TEST_SHIM_BIN=/mnt/k3sm/k3sm-shim K3SM_RUNTIME_TEST_PROG_BIN=/mnt/k3sm/prog `+
		`/mnt/k3sm/daemon.test -test.v -test.count=1 -test.run 'TestIntegrationRootlessUndelegatedSaysHow$'`,
		"TestIntegrationRootlessUndelegatedSaysHow")
}
