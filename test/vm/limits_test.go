package vm

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// The test's pods run the host's programs (image: native); the test
// program is on the share, which a native pod's Landlock policy reaches
// only as a volume.
const sleeper = `apiVersion: v1
kind: Pod
metadata: {name: sleeper}
spec:
  containers:
  - {name: main, image: native, command: [/bin/sleep, "3600"]}
---
`

// limitPods are what checkPodLimits looks at: a pod over its memory limit,
// a busy loop under a CPU limit and a fork bomb.
const limitPods = `apiVersion: v1
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
func podCgroup(t *testing.T, kc, pod string) string {
	t.Helper()
	uid := strings.TrimSpace(sh(t, time.Minute, kc+" get pod "+pod+" -o jsonpath={.metadata.uid}"))
	return strings.TrimSpace(waitGuest(t, time.Minute, pod+"'s cgroup", "d=$(find /sys/fs/cgroup -type d -path '*pod"+uid+"/main' | head -1); [ -n \"$d\" ] && echo $d"))
}

// checkPodLimits checks limitPods, applied with kc (the kubectl command
// line of the cluster under test), against the kernel's v2 files: the
// memory limit ends in OOMKilled with exit 137, cpu.max (and cpu.weight
// from the request) holds a busy loop
// to 10 % ± 3 of a core by cpu.stat, kubectl top agrees with cpu.stat and
// memory.current, and --pod-max-pids 50 stops a fork bomb while the node
// stays Ready.
func checkPodLimits(t *testing.T, kc string) {
	t.Run("memory limit: OOMKilled, exit 137, from memory.events", func(t *testing.T) {
		out := waitGuest(t, 3*time.Minute, "oom terminated", "j='{.status.containerStatuses[0].state.terminated'; s=$("+kc+` get pod oom -o jsonpath="$j.reason}"); [ -n "$s" ] && echo $s $(`+kc+` get pod oom -o jsonpath="$j.exitCode}")`)
		if strings.TrimSpace(out) != "OOMKilled 137" {
			t.Fatalf("oom pod ended %q, want OOMKilled 137", out)
		}
	})

	t.Run("CPU limit and kubectl top against cpu.stat and memory.current", func(t *testing.T) {
		waitGuest(t, 3*time.Minute, "spin Running", kc+" get pod spin -o jsonpath={.status.phase} | grep -x Running")
		cg := podCgroup(t, kc, "spin")
		if got := strings.TrimSpace(sh(t, time.Minute, "cat "+cg+"/cpu.max")); got != "10000 100000" {
			t.Errorf("cpu.max %q, want 10000 100000", got)
		}
		// The request (100m, from the limit) as the kubelet's shares, 102,
		// in v2's weight as runc converts them: 1 + (102-2)*9999/262142.
		if got := strings.TrimSpace(sh(t, time.Minute, "cat "+cg+"/cpu.weight")); got != "4" {
			t.Errorf("cpu.weight %q, want 4 (a 100m request)", got)
		}
		// The share of a core over 10 s, from cpu.stat.
		out := sh(t, time.Minute, "a=$(awk '/^usage_usec/{print $2}' "+cg+"/cpu.stat); sleep 10; b=$(awk '/^usage_usec/{print $2}' "+cg+"/cpu.stat); echo $((b-a))")
		usec, _ := strconv.Atoi(strings.TrimSpace(out))
		share := float64(usec) / 10e6
		t.Logf("busy loop under 100m: %.1f %% of a core over 10 s (cpu.stat)", share*100)
		if share < 0.07 || share > 0.13 {
			t.Errorf("a busy loop under 100m used %.1f %% of a core, want 10 ± 3", share*100)
		}
		top := waitGuest(t, 4*time.Minute, "kubectl top pod spin", kc+" top pod spin --no-headers")
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
		waitGuest(t, 3*time.Minute, "forkbomb Running", kc+" get pod forkbomb -o jsonpath={.status.phase} | grep -x Running")
		cg := podCgroup(t, kc, "forkbomb")
		pod := cg[:strings.LastIndex(cg, "/")]
		if got := strings.TrimSpace(sh(t, time.Minute, "cat "+pod+"/pids.max")); got != "50" {
			t.Errorf("the pod's pids.max %q, want 50 (--pod-max-pids)", got)
		}
		// The kernel counts a refused fork where the limit is (the pod)
		// or, since Linux 6.x, where the fork was tried (the container).
		// bash retries a refused fork a few times (about 15 s), then
		// gives up and exits, and the container restarts: wait for the pod
		// at its limit, with forks refused.
		out := waitGuest(t, 3*time.Minute, "forks refused with the pod at its limit", "n=$(cat "+pod+"/pids.events "+cg+"/pids.events | awk '/^max/{n+=$2} END{print n+0}'); c=$(cat "+pod+"/pids.current); [ \"$n\" -gt 0 ] && [ \"$c\" -ge 45 ] && echo $n $c")
		f := strings.Fields(out)
		if cur, _ := strconv.Atoi(f[len(f)-1]); cur > 50 {
			t.Errorf("pids.current %d, above the limit of 50", cur)
		}
		t.Logf("forks refused, pids.current: %s; the container restarted %s times", strings.TrimSpace(out),
			strings.TrimSpace(sh(t, time.Minute, kc+" get pod forkbomb -o jsonpath={.status.containerStatuses[0].restartCount}")))
		sh(t, time.Minute, kc+" get nodes --no-headers | grep -w Ready")
		sh(t, 3*time.Minute, kc+" delete pod forkbomb --wait=true --timeout=2m")
	})
}
