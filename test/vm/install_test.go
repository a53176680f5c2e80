package vm

import (
	"context"
	"fmt"
	"os"
	"strconv"
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

// pods run the host's programs (image: native); the test program is on the
// share, which a native pod's Landlock policy reaches only as a volume.
const pods = `apiVersion: v1
kind: Pod
metadata: {name: sleeper}
spec:
  containers:
  - {name: main, image: native, command: [/bin/sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: oom}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: native
    command: [/mnt/k3sm/prog, "echo:start", "alloc:200Mi", forever]
    resources: {limits: {memory: 32Mi}}
    volumeMounts: [{name: share, mountPath: /mnt/k3sm, readOnly: true}]
  volumes: [{name: share, hostPath: {path: /mnt/k3sm}}]
---
apiVersion: v1
kind: Pod
metadata: {name: spin}
spec:
  containers:
  - name: main
    image: native
    command: [/mnt/k3sm/prog, "alloc:48Mi", "spin:1h"]
    resources: {limits: {cpu: 100m, memory: 256Mi}}
    volumeMounts: [{name: share, mountPath: /mnt/k3sm, readOnly: true}]
  volumes: [{name: share, hostPath: {path: /mnt/k3sm}}]
---
apiVersion: v1
kind: Pod
metadata: {name: forkbomb}
spec:
  containers:
  - name: main
    image: native
    command: [/bin/bash, -c, "while :; do /bin/sleep 600 & done"]
`

// podCgroup is the cgroup directory of a pod's container, found by uid.
func podCgroup(t *testing.T, pod string) string {
	t.Helper()
	uid := strings.TrimSpace(sh(t, time.Minute, "k3sm kubectl get pod "+pod+" -o jsonpath={.metadata.uid}"))
	return strings.TrimSpace(waitGuest(t, time.Minute, pod+"'s cgroup", "d=$(find /sys/fs/cgroup -type d -path '*pod"+uid+"/main' | head -1); [ -n \"$d\" ] && echo $d"))
}

// k3sm install on the host users have: the unit runs the cluster with its
// pods' limits in its delegated cgroup v2 subtree, `kubectl top` reads the
// v2 files, a reboot brings the cluster and its pods back, and uninstall
// --purge leaves the machine as it was.
func TestInstallRebootUninstall(t *testing.T) {
	need(t)
	if binSkip != "" {
		if os.Getenv("K3SM_REQUIRE_VM") != "" {
			t.Fatal(binSkip)
		}
		t.Skip(binSkip)
	}
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
	sh(t, time.Minute, "k3sm kubectl apply -f - <<'EOF'\n"+pods+"EOF")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := guest.Output(context.Background(), "k3sm kubectl get pods -o wide; k3sm kubectl describe pods; for p in oom spin; do k3sm kubectl logs $p; done; journalctl -u k3sm --no-pager | tail -50")
			t.Logf("the guest's cluster:\n%s", out)
		}
	})

	t.Run("memory limit: OOMKilled, exit 137, from memory.events", func(t *testing.T) {
		out := waitGuest(t, 3*time.Minute, "oom terminated", `j='{.status.containerStatuses[0].state.terminated'; s=$(k3sm kubectl get pod oom -o jsonpath="$j.reason}"); [ -n "$s" ] && echo $s $(k3sm kubectl get pod oom -o jsonpath="$j.exitCode}")`)
		if strings.TrimSpace(out) != "OOMKilled 137" {
			t.Fatalf("oom pod ended %q, want OOMKilled 137", out)
		}
	})

	t.Run("CPU limit and kubectl top against cpu.stat and memory.current", func(t *testing.T) {
		waitGuest(t, 3*time.Minute, "spin Running", "k3sm kubectl get pod spin -o jsonpath={.status.phase} | grep -x Running")
		cg := podCgroup(t, "spin")
		if got := strings.TrimSpace(sh(t, time.Minute, "cat "+cg+"/cpu.max")); got != "10000 100000" {
			t.Errorf("cpu.max %q, want 10000 100000", got)
		}
		// The share of a core over 10 s, from cpu.stat.
		out := sh(t, time.Minute, "a=$(awk '/^usage_usec/{print $2}' "+cg+"/cpu.stat); sleep 10; b=$(awk '/^usage_usec/{print $2}' "+cg+"/cpu.stat); echo $((b-a))")
		usec, _ := strconv.Atoi(strings.TrimSpace(out))
		share := float64(usec) / 10e6
		t.Logf("busy loop under 100m: %.1f %% of a core over 10 s (cpu.stat)", share*100)
		if share < 0.07 || share > 0.13 {
			t.Errorf("a busy loop under 100m used %.1f %% of a core, want 10 ± 3", share*100)
		}
		top := waitGuest(t, 4*time.Minute, "kubectl top pod spin", "k3sm kubectl top pod spin --no-headers")
		f := strings.Fields(top)
		if len(f) < 3 {
			t.Fatalf("kubectl top: %q", top)
		}
		milli, _ := strconv.Atoi(strings.TrimSuffix(f[1], "m"))
		mem := sh(t, time.Minute, "echo $(( $(cat "+cg+"/memory.current) - $(awk '/^inactive_file/{print $2}' "+cg+"/memory.stat) ))")
		ws, _ := strconv.ParseFloat(strings.TrimSpace(mem), 64)
		topMi, _ := strconv.ParseFloat(strings.TrimSuffix(f[2], "Mi"), 64)
		t.Logf("kubectl top: %s; cgroup: %.0f Mi working set", strings.TrimSpace(top), ws/(1<<20))
		if milli < 90 || milli > 110 {
			t.Errorf("kubectl top says %dm for a busy loop held to 100m", milli)
		}
		if d := topMi - ws/(1<<20); d < -0.1*topMi || d > 0.1*topMi {
			t.Errorf("kubectl top says %.0fMi, the cgroup's working set is %.0fMi", topMi, ws/(1<<20))
		}
	})

	t.Run("pids.max 50 stops a fork bomb, the node stays Ready", func(t *testing.T) {
		waitGuest(t, 3*time.Minute, "forkbomb Running", "k3sm kubectl get pod forkbomb -o jsonpath={.status.phase} | grep -x Running")
		cg := podCgroup(t, "forkbomb")
		pod := cg[:strings.LastIndex(cg, "/")]
		if got := strings.TrimSpace(sh(t, time.Minute, "cat "+pod+"/pids.max")); got != "50" {
			t.Errorf("the pod's pids.max %q, want 50 (--pod-max-pids)", got)
		}
		// The kernel counts a refused fork where the limit is (the pod)
		// or, since Linux 6.x, where the fork was tried (the container).
		out := waitGuest(t, 2*time.Minute, "forks refused", "n=$(cat "+pod+"/pids.events "+cg+"/pids.events | awk '/^max/{n+=$2} END{print n+0}'); [ \"$n\" -gt 0 ] && echo $n $(cat "+pod+"/pids.current)")
		// bash retries a refused fork and goes on: the pod sits at its limit.
		f := strings.Fields(out)
		if cur, _ := strconv.Atoi(f[len(f)-1]); cur > 50 || cur < 40 {
			t.Errorf("pids.current %d, want the limit of 50 reached and held", cur)
		}
		t.Logf("forks refused, pids.current: %s", strings.TrimSpace(out))
		sh(t, time.Minute, "k3sm kubectl get nodes --no-headers | grep -w Ready")
		sh(t, 3*time.Minute, "k3sm kubectl delete pod forkbomb --wait=true --timeout=2m")
	})

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
