package vm

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// userManager makes sure the unprivileged account k3smtest exists and has
// a user manager running (lingering, as a user who logged in has), and
// sets uid and the environment systemctl --user needs from root's shell.
const userManager = `id k3smtest >/dev/null 2>&1 || useradd -m -s /bin/sh k3smtest
loginctl enable-linger k3smtest
uid=$(id -u k3smtest)
for i in $(seq 200); do [ -S /run/user/$uid/bus ] && break; sleep 0.3; done
export XDG_RUNTIME_DIR=/run/user/$uid DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/$uid/bus
`

// asUser runs a command as k3smtest with its user manager's environment.
const asUser = `runuser -u k3smtest -- env XDG_RUNTIME_DIR=$XDG_RUNTIME_DIR DBUS_SESSION_BUS_ADDRESS=$DBUS_SESSION_BUS_ADDRESS `

// rootlessData is the rootless server's data dir, in the account's home.
const rootlessData = "/home/k3smtest/k3sm"

// memAvailable prints memory.available as the kubelet computes it on
// cgroup v2 (MemTotal less the root's working set: MemTotal − MemFree −
// inactive_file), in MiB.
const memAvailable = `echo $(( ($(awk '/^MemFree:/{print $2}' /proc/meminfo) * 1024 + $(awk '/^inactive_file /{print $2}' /sys/fs/cgroup/memory.stat)) >> 20 ))`

// The whole server rootless, as a user runs it on a distribution that
// delegates cgroups to user managers: `systemd-run --user -p Delegate=yes
// k3sm server`. Before, from a session systemd did not delegate, doctor
// says the limits are not enforced and how to get them; under the
// delegated unit the pods' limits hold as under the installed unit
// (checkPodLimits), doctor passes, and memory pressure from the v2 files
// sets MemoryPressure and evicts the pod that causes it.
func TestRootlessServerUserDelegation(t *testing.T) {
	needBinaries(t)
	kc := "/mnt/k3sm/bin/k3sm kubectl --data-dir " + rootlessData
	sh(t, 2*time.Minute, "set -e\n"+userManager)
	t.Logf("user@.service delegates: %s", sh(t, time.Minute, userManager+"cat /sys/fs/cgroup/user.slice/user-$uid.slice/user@$uid.service/cgroup.controllers"))

	// doctor as the account; its exit status is 1 whenever any check
	// FAILs, whatever the cgroups check says, so only its text counts.
	doctor := func() string {
		out, _ := guest.Output(context.Background(), userManager+"cd /tmp; "+asUser+"/mnt/k3sm/bin/k3sm doctor --data-dir "+rootlessData+" 2>&1")
		return out
	}
	out := doctor()
	if !doctorSays(out, "cgroups", "WARN", "systemd-run --user -p Delegate=yes") {
		t.Errorf("doctor as the account, undelegated: want the cgroups check to WARN naming systemd-run --user -p Delegate=yes:\n%s", out)
	}

	// The eviction threshold: 1400Mi below what is available now, so the
	// server and the limit pods stay above it and one pod allocating the
	// difference crosses it.
	a0, _ := strconv.Atoi(strings.TrimSpace(sh(t, time.Minute, memAvailable)))
	threshold := a0 - 1400
	if threshold < 256 {
		t.Fatalf("the guest has %d MiB available: too little to test memory pressure", a0)
	}
	t0 := time.Now()
	sh(t, time.Minute, userManager+"cd /tmp; "+asUser+"systemd-run --user --unit k3sm-user -p Delegate=yes -p KillMode=mixed "+
		"/mnt/k3sm/bin/k3sm server --data-dir "+rootlessData+" --pod-max-pids 50 "+
		fmt.Sprintf("'--eviction-hard=memory.available<%dMi' --eviction-pressure-transition-period=20s --housekeeping-interval=5s", threshold))
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := guest.Output(context.Background(), kc+" get pods -o wide; "+kc+" describe pods; "+kc+" describe node; "+
				userManager+asUser+"journalctl --user -u k3sm-user --no-pager | tail -80")
			t.Logf("the guest's rootless cluster:\n%s", out)
		}
		guest.Output(context.Background(), userManager+asUser+"systemctl --user stop k3sm-user; "+asUser+"systemctl --user reset-failed k3sm-user; rm -rf "+rootlessData)
	})
	waitGuest(t, 10*time.Minute, "the rootless node Ready", kc+" get nodes --no-headers | grep -w Ready")
	t.Logf("rootless server Ready in %s in the guest (%s); memory.available was %d MiB, threshold %d MiB", time.Since(t0).Round(time.Second), guest.Accel, a0, threshold)
	// Every process of the server, and of its pods (their root is the
	// account), is the account's, in the user's delegated unit.
	if out := sh(t, time.Minute, "p=$(find /sys/fs/cgroup/user.slice -path '*/k3sm-user.service/*' -name cgroup.procs -exec cat {} + | paste -sd,); "+
		"if [ -z \"$p\" ]; then echo no process in the unit; else ps -o user=,comm= -p $p | grep -v '^k3smtest ' || true; fi"); strings.TrimSpace(out) != "" {
		t.Errorf("processes of the unit not run by the account:\n%s", out)
	}
	out = doctor()
	if !doctorSays(out, "cgroups", "PASS", "the running runtime reports") {
		t.Errorf("doctor as the account, under the delegated unit: want the cgroups check to PASS from the runtime's report:\n%s", out)
	}

	sh(t, time.Minute, kc+" apply -f - <<'EOF'\n"+limitPods+"EOF")
	checkPodLimits(t, kc)

	t.Run("memory pressure from the v2 files: MemoryPressure, the hog evicted, then no pressure", func(t *testing.T) {
		cond := kc + ` get node -o jsonpath='{.items[0].status.conditions[?(@.type=="MemoryPressure")].status}'`
		if got := strings.TrimSpace(sh(t, time.Minute, cond)); got != "False" {
			t.Fatalf("MemoryPressure %q before the hog", got)
		}
		now, _ := strconv.Atoi(strings.TrimSpace(sh(t, time.Minute, memAvailable)))
		hog := now - threshold + 300
		t.Logf("memory.available %d MiB, threshold %d MiB: the hog takes %d MiB", now, threshold, hog)
		sh(t, time.Minute, kc+" apply -f - <<'EOF'\n"+fmt.Sprintf(hogPod, hog)+"EOF")
		waitGuest(t, 3*time.Minute, "MemoryPressure True", cond+" | grep -x True")
		out := waitGuest(t, 2*time.Minute, "the hog evicted", kc+" get pod hog -o 'jsonpath={.status.phase} {.status.reason}' | grep -x 'Failed Evicted'")
		t.Logf("hog: %s; memory.available now %s MiB", strings.TrimSpace(out), strings.TrimSpace(sh(t, time.Minute, memAvailable)))
		// Only the hog: the Guaranteed spin pod within its request stays.
		if got := strings.TrimSpace(sh(t, time.Minute, kc+" get pod spin -o jsonpath={.status.phase}")); got != "Running" {
			t.Errorf("spin is %s after the hog's eviction", got)
		}
		waitGuest(t, 2*time.Minute, "MemoryPressure False again", cond+" | grep -x False")
		if out := sh(t, time.Minute, kc+" get events --field-selector reason=Evicted -o name"); len(strings.Fields(out)) != 1 {
			t.Errorf("Evicted events: %q, want the hog's only", out)
		}
	})
}

// hogPod allocates %d MiB and keeps it, with no request: the first pod the
// kubelet's ranking evicts.
const hogPod = `apiVersion: v1
kind: Pod
metadata: {name: hog}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: native
    command: [/mnt/k3sm/prog, "alloc:%dMi", forever]
    volumeMounts: [{name: share, mountPath: /mnt/k3sm, readOnly: true}]
  volumes: [{name: share, hostPath: {path: /mnt/k3sm}}]
`

// doctorSays reports whether doctor's text output has check name with
// status and text in its line or the fix below it.
func doctorSays(out, name, status, text string) bool {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if strings.Contains(l, status) && strings.Contains(l, name) {
			block := l
			if i+1 < len(lines) {
				block += lines[i+1]
			}
			if strings.Contains(block, text) {
				return true
			}
		}
	}
	return false
}
