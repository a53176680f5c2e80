package vm

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// sh runs script in the guest and fails the test on a non-zero exit.
func sh(t *testing.T, timeout time.Duration, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := guest.Output(ctx, script)
	if err != nil {
		t.Fatalf("guest: %s: %v\n%s", script, err, out)
	}
	return out
}

// waitGuest runs script every two seconds until it exits 0, and returns
// its output then (poll.Every fails the test naming what, with the last
// output, when timeout passes first).
func waitGuest(t *testing.T, timeout time.Duration, what, script string) string {
	t.Helper()
	var out string
	poll.Every(t, context.Background(), timeout, 2*time.Second, what, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var err error
		if out, err = guest.Output(ctx, script); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	return out
}

// The guest's files, links and nft tables that install may touch and
// uninstall must restore; and what of k3sm is in the cgroup tree or
// systemd.
// The shadow suite's backups (/etc/subuid- and the like) are left by the
// account install adds and uninstall deletes, not by k3sm.
const machineState = `find /etc /usr/local -xdev 2>/dev/null | grep -v -e '^/etc/machine-id' -e '^/etc/resolv.conf' -e '^/etc/[a-z]*-$' | sort
ip -o link show | cut -d: -f2 | sed 's/@.*//' | sort; ip route show | sort; nft list tables | sort
find /sys/fs/cgroup -name '*k3sm*' | sort; systemctl list-unit-files --no-legend 'k3sm*' | sort`

// k3sm install on the host users have: the unit runs the cluster with its
// pods' limits in its delegated cgroup v2 subtree, `kubectl top` reads the
// v2 files, a reboot brings the cluster and its pods back, and uninstall
// --purge leaves the machine as it was.
func TestInstallRebootUninstall(t *testing.T) {
	needBinaries(t)
	before := sh(t, time.Minute, machineState)
	t0 := time.Now()
	out := sh(t, 20*time.Minute, "/mnt/k3sm/bin/k3sm install --timeout 15m --pod-max-pids 50 2>&1")
	if !strings.Contains(out, "cluster is up") {
		t.Fatalf("k3sm install:\n%s", out)
	}
	t.Logf("k3sm install took %s in the guest (%s)", time.Since(t0).Round(time.Second), guest.Accel)
	unit := sh(t, time.Minute, "cat /etc/systemd/system/k3sm.service")
	if !strings.Contains(unit, "Delegate=yes") {
		t.Fatalf("unit without Delegate=yes:\n%s", unit)
	}
	waitGuest(t, 5*time.Minute, "the node Ready", "k3sm kubectl get nodes --no-headers | grep -w Ready")
	sh(t, time.Minute, "k3sm kubectl apply -f - <<'EOF'\n"+sleeper+limitPods+"EOF")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := guest.Output(context.Background(), "k3sm kubectl get pods -o wide; k3sm kubectl describe pods; for p in oom spin; do k3sm kubectl logs $p; done; journalctl -u k3sm --no-pager | tail -50")
			t.Logf("the guest's cluster:\n%s", out)
		}
	})

	checkPodLimits(t, "k3sm kubectl")

	pid := strings.TrimSpace(waitGuest(t, time.Minute, "the sleeper's process", "pgrep -f '^/bin/sleep 3600'"))
	t1 := time.Now()
	if err := guest.Reboot(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitGuest(t, 10*time.Minute, "the node Ready after the reboot", "k3sm kubectl get nodes --no-headers | grep -w Ready")
	waitGuest(t, 5*time.Minute, "the sleeper Running after the reboot",
		"k3sm kubectl get pod sleeper -o 'jsonpath={.status.phase} {.status.containerStatuses[0].ready}' | grep -x 'Running true'")
	now := strings.TrimSpace(waitGuest(t, time.Minute, "the sleeper's process", "pgrep -f '^/bin/sleep 3600'"))
	if now == pid {
		t.Errorf("the sleeper's pid %s survived a reboot?", pid)
	}
	t.Logf("reboot to the sleeper Running again: %s", time.Since(t1).Round(time.Second))

	out = sh(t, 5*time.Minute, "k3sm uninstall --purge 2>&1")
	t.Logf("k3sm uninstall --purge:\n%s", out)
	if after := sh(t, time.Minute, machineState); after != before {
		t.Fatalf("uninstall --purge left the guest different from before install:\n--- before ---\n%s\n--- after ---\n%s", before, after)
	}
	// By process name: a pattern on command lines would match this shell.
	if out := sh(t, time.Minute, "ps -eo pid=,comm= | grep -E ' (k3sm|k3sm-.*|sleep|prog)$' || true"); strings.TrimSpace(out) != "" {
		t.Errorf("processes left after uninstall --purge:\n%s", out)
	}
}
