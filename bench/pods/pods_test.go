package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

func msList(n int) []time.Duration {
	var ds []time.Duration
	for i := 1; i <= n; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	return ds
}

func TestPercentileNearestRank(t *testing.T) {
	ds := msList(100)
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.9, 90 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := pct(ds, c.p); got != c.want {
			t.Errorf("pct(1..100ms, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := pct(msList(500), 0.99); got != 495*time.Millisecond {
		t.Errorf("p99 of 500 = %v", got)
	}
	if pct(nil, 0.5) != -1 {
		t.Error("empty series must report -1")
	}
}

func TestMedian(t *testing.T) {
	if got := median([]time.Duration{3, 1, 2}); got != 2 {
		t.Errorf("odd: %v", got)
	}
	if got := median([]time.Duration{4, 1, 2, 3}); got != 2 {
		t.Errorf("even: %v (want mean of 2 and 3, truncated)", got)
	}
	in := []time.Duration{3, 1, 2}
	median(in)
	if in[0] != 3 {
		t.Error("median reordered its input")
	}
}

func TestParseSmapsRollup(t *testing.T) {
	text := `55d0c0a00000-7ffd1a9f4000 ---p 00000000 00:00 0                          [rollup]
Rss:                4712 kB
Pss:                3391 kB
Pss_Dirty:          1200 kB
Pss_Anon:           1100 kB
Pss_File:           2291 kB
Pss_Shmem:             0 kB
Shared_Clean:       1300 kB
`
	m, err := parseSmapsRollup(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if m != (mem{RSS: 4712, PSS: 3391, PSSAnon: 1100, PSSFile: 2291}) {
		t.Errorf("got %+v", m)
	}
	if _, err := parseSmapsRollup(strings.NewReader("garbage\n")); err == nil {
		t.Error("no Rss line must be an error")
	}
}

func TestParseStat(t *testing.T) {
	stat := "123 (a) (b) S 77 123 123 0 -1 4194560 2553 0 0 0 31 7 0 0 20 0 9 0 6070 1268510720 2110"
	ppid, state, ticks, err := parseStat(stat)
	if err != nil || ppid != 77 || state != "S" || ticks != 38 {
		t.Errorf("got %d %q %d %v", ppid, state, ticks, err)
	}
	if _, _, _, err := parseStat("nonsense"); err == nil {
		t.Error("want an error")
	}
	if _, _, _, err := parseStat("1 (x) S 0 1"); err == nil {
		t.Error("want an error for a short line")
	}
}

func TestClassify(t *testing.T) {
	bin, shim, data := "/w/bin/k3sm", "/w/bin/k3sm-shim", "/w/real"
	all := []proc{
		{Pid: 10, PPid: 1, Exe: bin, Args: []string{bin, "server"}},
		{Pid: 11, PPid: 10, Exe: bin, Args: []string{bin, "kube-apiserver"}},
		{Pid: 12, PPid: 10, Exe: bin, Args: []string{bin, "runtimed"}},
		{Pid: 13, PPid: 12, Exe: shim, Args: []string{shim, data + "/pods/u1/attempts/main/0"}},
		{Pid: 14, PPid: 13, Exe: data + "/pods/u1/roots/main/app/prog", Args: []string{"/app/prog", "forever"}},
		{Pid: 15, PPid: 1, Exe: shim, Args: []string{shim, data + "/pods/u2/attempts/main/0"}},  // re-parented shim
		{Pid: 16, PPid: 1, Exe: shim, Args: []string{shim, "/w/floor/pods/u3/attempts/main/0"}}, // another server's
		{Pid: 17, PPid: 1, Exe: bin, Args: []string{bin, "node"}},                               // not in the tree
		{Pid: 18, PPid: 10, Exe: "/usr/bin/true", Args: []string{"true"}},
		{Pid: 19, PPid: 15, Exe: "/app/prog", Args: []string{"/app/prog", "forever"}}, // sandboxed: its own root's path
		{Pid: 20, PPid: 19, Exe: "/bin/busybox", Args: []string{"sh"}},                // and its children
		{Pid: 21, PPid: 16, Exe: "/app/prog", Args: []string{"/app/prog", "forever"}}, // another server's workload
	}
	got := map[int]string{}
	for _, p := range classify(all, 10, bin, shim, data) {
		got[p.Pid] = p.Role
	}
	want := map[int]string{10: "server", 11: "kube-apiserver", 12: "runtimed", 13: "k3sm-shim", 14: "workload", 15: "k3sm-shim", 18: "true", 19: "workload", 20: "workload"}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for pid, role := range want {
		if got[pid] != role {
			t.Errorf("pid %d: role %q, want %q", pid, got[pid], role)
		}
	}
}

func pod(name, node string, phase corev1.PodPhase, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}}
}

func TestTrackerRecordsFirstSightings(t *testing.T) {
	tr := newTracker(2)
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tr.markSent("a", at(0))
	tr.markSent("b", at(1))
	tr.markCreated("a", at(10))
	tr.observe(watch.Added, pod("a", "", corev1.PodPending, false), at(12))
	tr.observe(watch.Modified, pod("a", "n", corev1.PodPending, false), at(20))
	tr.observe(watch.Modified, pod("a", "n", corev1.PodRunning, false), at(30)) // Running but not Ready: not yet
	tr.observe(watch.Modified, pod("a", "n", corev1.PodRunning, true), at(40))
	tr.observe(watch.Modified, pod("a", "n", corev1.PodRunning, true), at(90)) // later events change nothing
	tr.observe(watch.Added, pod("b", "n", corev1.PodRunning, true), at(50))
	select {
	case <-tr.done:
	default:
		t.Fatalf("done not closed: %s", tr.summary())
	}
	ps := tr.snapshot()
	a, b := ps[0], ps[1]
	if a.created != at(10) || a.scheduled != at(20) || a.running != at(40) || a.uid != "uid-a" {
		t.Errorf("a: %+v", a)
	}
	if b.created != at(50) || b.scheduled != at(50) || b.running != at(50) {
		t.Errorf("b: %+v", b)
	}
	var r burstResult
	ps[0].admitted, ps[0].started = at(25), at(33)
	r.fill(ps)
	if r.Span != 50*time.Millisecond || r.Lat[0] != 40*time.Millisecond || r.Lat[1] != 49*time.Millisecond {
		t.Errorf("span %v lat %v", r.Span, r.Lat)
	}
	if len(r.SchedAdmit) != 1 || r.SchedAdmit[0] != 5*time.Millisecond || r.AdmitStart[0] != 8*time.Millisecond || r.StartRunning[0] != 7*time.Millisecond {
		t.Errorf("runtime breakdown: %v %v %v", r.SchedAdmit, r.AdmitStart, r.StartRunning)
	}
}

func TestRuntimePodTimes(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "pods", "u1"), 0o700)
	js := `{"spec":{},"startTime":"2026-11-30T00:00:01.5Z","containers":[{"name":"main","restartCount":0,
	  "state":{"running":{"startedAt":"2026-11-30T00:00:01.75Z"}}}]}`
	os.WriteFile(filepath.Join(dir, "pods", "u1", "pod.json"), []byte(js), 0o600)
	a, s, err := runtimePodTimes(dir, "u1")
	if err != nil {
		t.Fatal(err)
	}
	if s.Sub(a) != 250*time.Millisecond {
		t.Errorf("admitted %v started %v", a, s)
	}
	if _, _, err := runtimePodTimes(dir, "missing"); err == nil {
		t.Error("want an error for a missing pod")
	}
}

func TestLeaseMaxGap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := &nodeWatch{renewals: []time.Time{t0, t0.Add(10 * time.Second), t0.Add(22 * time.Second)}, end: t0.Add(30 * time.Second)}
	if g := w.maxGap(); g != 12*time.Second {
		t.Errorf("gap %v", g)
	}
	w.end = t0.Add(60 * time.Second) // the lease stopped being renewed
	if g := w.maxGap(); g != 38*time.Second {
		t.Errorf("gap to the end %v", g)
	}
}

func TestServerArgsLoopbackOnly(t *testing.T) {
	args := strings.Join(serverArgs("/d", []int{1, 2, 3, 4}, instantFlag("floor"), "--max-pods", "510"), " ")
	for _, want := range []string{"--bind-address 127.0.0.1", "--advertise-address 127.0.0.1", "--https-listen-port 1",
		"--scheduler-port 2", "--controller-manager-port 3", "--kubelet-port 4", "--node-instant", "--max-pods 510"} {
		if !strings.Contains(args, want) {
			t.Errorf("%q lacks %q", args, want)
		}
	}
}

// Each mode's server gets its own node flag and no other: the fair floor's
// flag implies --node-instant, so it must not be given beside it.
func TestServerArgsNodeFlags(t *testing.T) {
	for mode, want := range map[string]string{"real": "", "floor": "--node-instant", "fair": "--node-instant-writes", upstreamRatesMode: "--node-instant"} {
		var got []string
		for _, a := range serverArgs("/d", []int{1, 2, 3, 4}, instantFlag(mode), "--max-pods", "510") {
			if strings.Contains(a, "instant") {
				got = append(got, a)
			}
		}
		if want == "" && len(got) > 0 || want != "" && (len(got) != 1 || got[0] != want) {
			t.Errorf("%s server: node flags %q, want %q", mode, got, want)
		}
	}
}

func TestPodsNeverRunningAreUnbounded(t *testing.T) {
	t0 := time.Unix(1000, 0)
	pods := []podTimes{
		{name: "a", sent: t0, created: t0.Add(time.Millisecond), scheduled: t0.Add(2 * time.Millisecond), running: t0.Add(10 * time.Millisecond)},
		{name: "b", sent: t0, created: t0.Add(time.Millisecond), scheduled: t0.Add(2 * time.Millisecond)}, // stuck
	}
	r := burstResult{N: 3} // and one never created
	r.fill(pods)
	if len(r.Lat) != 3 || pct(r.Lat, 0.3) != 10*time.Millisecond || pct(r.Lat, 0.5) != never || r.Span != never || r.SpanSeen != 10*time.Millisecond {
		t.Errorf("lat %v span %v", r.Lat, r.Span)
	}
	if len(r.ToSched) != 2 || len(r.SchedRun) != 1 {
		t.Errorf("steps: sched %v run %v", r.ToSched, r.SchedRun)
	}
	if ms(never) != "∞" || ratio(never, time.Second) != "∞" {
		t.Error("never must render as ∞")
	}
	if median([]time.Duration{time.Second, never, never}) != never {
		t.Error("the median of mostly-never rounds is never")
	}
}

func TestCPUTimeAgreesWithStat(t *testing.T) {
	ticks := func() int64 {
		b, err := os.ReadFile("/proc/self/stat")
		if err != nil {
			t.Skip("needs /proc")
		}
		_, _, n, err := parseStat(string(b))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	t0, c0 := ticks(), cpuTime(os.Getpid(), 0)
	// Burn CPU until the kernel's own 10 ms ticks say 50 ms were used (a
	// busy loop, not a wait: no poll).
	for deadline := time.Now().Add(20 * time.Second); ticks()-t0 < 5; {
		if time.Now().After(deadline) {
			t.Skip("no CPU time to be had")
		}
		for end := time.Now().Add(time.Millisecond); time.Now().Before(end); {
		}
	}
	used := time.Duration(ticks()-t0) * time.Second / clockTicks
	if d := cpuTime(os.Getpid(), 0) - c0; d < used-20*time.Millisecond || d > used+50*time.Millisecond {
		t.Errorf("schedstat says %v, stat ticks say %v", d, used)
	}
}

func TestChildTicks(t *testing.T) {
	stat := "123 (a b) S 77 123 123 0 -1 4194560 2553 0 0 0 31 7 12 5 20 0 9 0 6070 1268510720 2110"
	if got := childTicks(stat); got != 17 {
		t.Errorf("cutime+cstime = %d, want 17", got)
	}
	if childTicks("1 (x) S 0 1") != 0 || childTicks("nonsense") != 0 {
		t.Error("a malformed stat must give 0")
	}
}

func TestCPUByRoleCountsReapedChildren(t *testing.T) {
	got := cpuByRole([]proc{
		{Pid: 1, Role: "containerd-shim-runc-v2", CPU: 5 * time.Millisecond, ChildCPU: 30 * time.Millisecond},
		{Pid: 2, Role: "kubelet", CPU: 7 * time.Millisecond},
	})
	if got["containerd-shim-runc-v2"] != 5*time.Millisecond || got["kubelet"] != 7*time.Millisecond || got[reapedRole] != 30*time.Millisecond {
		t.Errorf("got %v", got)
	}
}

func TestPeerClassify(t *testing.T) {
	shim := "/c/bin/containerd-shim-runc-v2"
	p := &peer{bins: peerBins{shim: shim},
		kubelet: &exec.Cmd{Process: &os.Process{Pid: 20}}, containerd: &exec.Cmd{Process: &os.Process{Pid: 21}}}
	all := []proc{
		{Pid: 20, PPid: 1, Exe: "/c/bin/kubelet"},
		{Pid: 21, PPid: 1, Exe: "/c/bin/containerd"},
		{Pid: 30, PPid: 1, Exe: shim},                // re-parented shim
		{Pid: 31, PPid: 30, Exe: "/pause"},           // sandbox
		{Pid: 32, PPid: 30, Exe: "/usr/sbin/runc"},   // runc while it runs
		{Pid: 33, PPid: 30, Exe: "/app/prog"},        // the container
		{Pid: 34, PPid: 33, Exe: "/app/helper"},      // the container's child
		{Pid: 40, PPid: 1, Exe: "/usr/bin/dockerd"},  // not the peer's
		{Pid: 41, PPid: 40, Exe: "/usr/sbin/runc"},   // another engine's
		{Pid: 42, PPid: 1, Exe: "/other/shim-runc"},  // another containerd's shim
		{Pid: 43, PPid: 21, Exe: "/usr/bin/unshare"}, // containerd's helpers are in its reaped children, not listed
	}
	got := map[int]string{}
	for _, pr := range p.classify(all) {
		if _, dup := got[pr.Pid]; dup {
			t.Errorf("pid %d listed twice", pr.Pid)
		}
		got[pr.Pid] = pr.Role
	}
	want := map[int]string{20: "kubelet", 21: "containerd", 30: "containerd-shim-runc-v2", 31: "pause", 32: "runc", 33: "workload", 34: "workload"}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for pid, role := range want {
		if got[pid] != role {
			t.Errorf("pid %d: role %q, want %q", pid, got[pid], role)
		}
	}
}

func TestRoundOrderRotates(t *testing.T) {
	names := func(ss []*server) string {
		var out []string
		for _, s := range ss {
			out = append(out, s.mode)
		}
		return strings.Join(out, ",")
	}
	two := []*server{{mode: "real"}, {mode: "floor"}}
	three := append(two[:2:2], &server{mode: "peer"})
	four := []*server{{mode: "real"}, {mode: "floor"}, {mode: "fair"}, {mode: "peer"}}
	for _, c := range []struct {
		modes []*server
		round int
		want  string
	}{{two, 1, "real,floor"}, {two, 2, "floor,real"}, {two, 3, "real,floor"},
		{three, 1, "real,floor,peer"}, {three, 2, "floor,peer,real"}, {three, 3, "peer,real,floor"}, {three, 4, "real,floor,peer"},
		{four, 2, "floor,fair,peer,real"}, {four, 4, "peer,real,floor,fair"}, {four, 5, "real,floor,fair,peer"}} {
		if got := names(roundOrder(c.modes, c.round)); got != c.want {
			t.Errorf("%d modes, round %d: %s, want %s", len(c.modes), c.round, got, c.want)
		}
	}
}

// The kubelet's configuration must decode strictly into the kubelet's own
// type (a misspelt field would be silently ignored by the kubelet).
func TestKubeletConfigDecodesStrictly(t *testing.T) {
	var kc kubeletv1beta1.KubeletConfiguration
	if err := yaml.UnmarshalStrict([]byte(kubeletConfig("/w/peer", "/w/ca.crt", 10350, 10348, "10.43.0.10")), &kc); err != nil {
		t.Fatal(err)
	}
	if kc.CgroupRoot != "/"+peerCgroupRoot || kc.CgroupDriver != "cgroupfs" || kc.FailCgroupV1 == nil || *kc.FailCgroupV1 ||
		kc.FailSwapOn == nil || *kc.FailSwapOn || !kc.ProtectKernelDefaults || kc.Port != 10350 || kc.HealthzPort == nil || *kc.HealthzPort != 10348 ||
		kc.ReadOnlyPort != 0 || kc.Address != "127.0.0.1" || kc.ContainerRuntimeEndpoint != "unix:///w/peer/containerd.sock" ||
		kc.PodLogsDir != "/w/peer/pod-logs" || kc.EvictionHard["imagefs.available"] != "1%" || len(kc.ClusterDNS) != 1 {
		t.Errorf("got %+v", kc)
	}
}

// Every path containerd is given lies under the peer's directory, but the
// runc and CNI binaries it runs.
func TestContainerdConfigIsPrivate(t *testing.T) {
	b := peerBins{runc: "/usr/sbin/runc", cniDir: "/usr/lib/cni"}
	cfg := containerdConfig("/w/peer", b, "127.0.0.1:5000/bench/pause:v1")
	for _, want := range []string{"version = 3", `imports = []`, "SystemdCgroup = false", `sandbox = "127.0.0.1:5000/bench/pause:v1"`,
		`address = "/w/peer/containerd.sock"`, `config_path = "/w/peer/certs.d"`, `conf_dir = "/w/peer/cni"`, "io.containerd.nri.v1.nri"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %s:\n%s", want, cfg)
		}
	}
	for _, f := range strings.Split(cfg, `"`) {
		if strings.HasPrefix(f, "/") && !strings.HasPrefix(f, "/w/peer/") && f != b.runc && f != b.cniDir {
			t.Errorf("config names %s, outside the peer's directory", f)
		}
	}
	var cni struct {
		Plugins []struct {
			Type, Bridge string
			IPAM         struct {
				Ranges  [][]struct{ Subnet string }
				DataDir string
			}
		}
	}
	if err := json.Unmarshal([]byte(cniConfig("/w/peer", "100.64.1.0/24")), &cni); err != nil {
		t.Fatal(err)
	}
	if len(cni.Plugins) != 1 || cni.Plugins[0].Type != "bridge" || cni.Plugins[0].IPAM.Ranges[0][0].Subnet != "100.64.1.0/24" ||
		cni.Plugins[0].IPAM.DataDir != "/w/peer/cni-ipam" || len(cni.Plugins[0].Bridge) > 15 {
		t.Errorf("cni config: %+v", cni)
	}
}

func burstOf(mode, kind string, round, order int, lat ...int) *burstResult {
	r := &burstResult{Mode: mode, Kind: kind, Round: round, Order: order, N: len(lat),
		CPU: map[string]time.Duration{"kube-apiserver": time.Duration(len(lat)) * 10 * time.Millisecond}}
	for _, l := range lat {
		d := time.Duration(l) * time.Millisecond
		r.Lat, r.Created, r.ToSched, r.SchedRun = append(r.Lat, d), append(r.Created, d/10), append(r.ToSched, d/5), append(r.SchedRun, d-d/5)
	}
	r.Span = r.Lat[len(r.Lat)-1]
	return r
}

func TestReportPeerColumns(t *testing.T) {
	o := options{pods: 4, creators: 2, qps: 100, rounds: 1, singles: 2, settle: time.Second, stall: time.Second}
	res := &results{peer: "kubelet v1.37.2, containerd 2.2.9 (from _output/bench/peer-bin), runc 1.1.5", peerRan: true,
		singles: []*burstResult{
			burstOf("real", "single", 1, 1, 200), burstOf("floor", "single", 1, 2, 100), burstOf("peer", "single", 1, 3, 800),
			burstOf("floor", "single", 2, 1, 100), burstOf("peer", "single", 2, 2, 1000), burstOf("real", "single", 2, 3, 300),
		},
		bursts: []*burstResult{burstOf("real", "pods", 1, 1, 100, 200, 300, 400), burstOf("floor", "pods", 1, 2, 50, 60, 70, 80),
			burstOf("peer", "pods", 1, 3, 400, 800, 1200, 1600)},
	}
	rep := renderReport(o, machine{}, res, nil)
	for _, want := range []string{
		"- Peer (issue 12): another node, `bench-peer`, joined to the real server's control plane: upstream kubelet v1.37.2, containerd 2.2.9",
		"| ms | real node | floor | peer (kubelet + containerd) | ratio real ÷ floor | ratio real ÷ peer |",
		"| p50 | 200 | 100 | 800 | 2.00× | 0.25× |",
		"| p99 | 300 | 100 | 1000 | 3.00× | 0.30× |",
		"one pod at a time: p50 **0.25×** (200 ms vs 800 ms), p99 **0.30×** (300 ms vs 1000 ms)",
		"| **p50** | 200 | 60 | 800 | 3.33× | 0.25× |",
		"| **p99** | 400 | 80 | 1600 | 5.00× | 0.25× |",
		"burst of 4: p50 **0.25×** (200 ms vs 800 ms), p99 **0.25×** (400 ms vs 1600 ms)",
		"| step | real p50 | real p99 | floor p50 | floor p99 | peer p50 | peer p99 |",
		"| real: runtime CreatePod → process started ¹ | – | – | – | – | – | – |",
		"| process | real | floor | peer |",
		"| kube-apiserver | 10.0 | 10.0 | 10.0 |",
		"| writes per pod | real | floor | peer |",
		"| 1 | peer | third | 800 | 1600 |",
	} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}

	if !strings.Contains(rep, "Goals (issue 35): real ÷ kubelet + containerd ≤ 0.1× at p50 **not met** (0.25×), at p99 **not met** (0.25×).") {
		t.Errorf("burst lacks the peer goal of issue 35:\n%s", rep)
	}
	if strings.Contains(rep, "fair") || !strings.Contains(rep, "- Setup: two servers side by side") ||
		!strings.Contains(rep, "  binary: the **real** node, and the **floor**, the same binary with `--node-instant`") {
		t.Errorf("fair floor shown though it did not run:\n%s", rep)
	}

	// Without the peer the tables keep their two modes, and the reason is shown.
	res.peer, res.peerRan = "skipped: no kubelet", false
	res.singles, res.bursts = res.singles[:2], res.bursts[:2]
	res.singles[1].Round = 1
	rep = renderReport(o, machine{}, res, nil)
	if strings.Contains(rep, "peer (kubelet") || strings.Contains(rep, "peer p50") || strings.Contains(rep, "real ÷ peer") || strings.Contains(rep, "issue 35") {
		t.Errorf("peer columns without a peer:\n%s", rep)
	}
	for _, want := range []string{"- Peer (issue 12): skipped: no kubelet", "| ms | real node | floor | ratio real ÷ floor |",
		"| step | real p50 | real p99 | floor p50 | floor p99 |\n", "| process | real | floor |\n"} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
}

// The Deployment rounds on the floor with upstream's client rates get their
// own before/after table; without that server there is none.
func TestReportUpstreamRates(t *testing.T) {
	o := options{pods: 2, creators: 1, qps: 100, deployRounds: 1, settle: time.Second, stall: time.Second}
	res := &results{peer: "skipped (-peer=false)", deploys: []*burstResult{burstOf("real", "deployment", 1, 1, 300, 400),
		burstOf("floor", "deployment", 1, 2, 100, 200), burstOf(upstreamRatesMode, "deployment", 1, 3, 300, 800)}}
	rep := renderReport(o, machine{}, res, nil)
	for _, want := range []string{"`--kube-controller-manager-arg=kube-api-qps=20 --kube-controller-manager-arg=kube-api-burst=30",
		"| ms | floor, k3sm's rates | floor, upstream's rates | ratio upstream's ÷ k3sm's |",
		"| **first create sent → last pod Running** | 200 | 800 | 4.00× |"} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
	res.deploys = res.deploys[:2]
	if rep := renderReport(o, machine{}, res, nil); strings.Contains(rep, "upstream's rates") {
		t.Errorf("rates table without that server:\n%s", rep)
	}
}

// The fair floor (issue 35) gets a column, a ratio and its goals wherever
// the floor has a column, and the setup says what its node does.
func TestReportFairColumns(t *testing.T) {
	o := options{pods: 4, creators: 2, qps: 100, rounds: 1, singles: 2, deployRounds: 1, fair: true, settle: time.Second, stall: time.Second}
	fairBurst := burstOf("fair", "pods", 1, 3, 100, 180, 300, 350)
	fairBurst.Updates, fairBurst.Events = 2, map[string]float64{"Pulled": 1, "Created": 1, "Started": 1}
	res := &results{peer: "kubelet v1.37.2, containerd 2.2.9, runc 1.1.5", peerRan: true,
		singles: []*burstResult{
			burstOf("real", "single", 1, 1, 120), burstOf("floor", "single", 1, 2, 50), burstOf("fair", "single", 1, 3, 100), burstOf("peer", "single", 1, 4, 1000),
			burstOf("floor", "single", 2, 1, 50), burstOf("fair", "single", 2, 2, 100), burstOf("peer", "single", 2, 3, 2000), burstOf("real", "single", 2, 4, 150),
		},
		bursts: []*burstResult{burstOf("real", "pods", 1, 1, 100, 200, 300, 400), burstOf("floor", "pods", 1, 2, 50, 60, 70, 80),
			fairBurst, burstOf("peer", "pods", 1, 4, 1000, 2500, 2800, 3000)},
		deploys: []*burstResult{burstOf("real", "deployment", 1, 1, 300, 400), burstOf("floor", "deployment", 1, 2, 100, 200),
			burstOf("fair", "deployment", 1, 3, 200, 250)},
	}
	rep := renderReport(o, machine{}, res, nil)
	singles, bursts, _ := strings.Cut(rep, "### Pod create → Running, burst")
	bursts, deploys, _ := strings.Cut(bursts, "### Deployment")
	for _, c := range []struct{ part, want string }{
		{singles, "- Setup: three servers side by side, each on its own data dir and loopback ports, running a private copy of the\n" +
			"  binary: the **real** node, the **floor**, the same binary with `--node-instant`"},
		{singles, "and the **fair floor**, the same binary with `--node-instant-writes`: its node translates each pod's spec as a real\n" +
			"  start does (requesting its service-account token, reading its ConfigMaps and Secrets), publishes the Pending status\n" +
			"  with the containers waiting in ContainerCreating, emits Pulled, Created and Started per container"},
		{singles, "| ms | real node | floor | fair floor | peer (kubelet + containerd) | ratio real ÷ floor | ratio real ÷ fair floor | ratio real ÷ peer |\n" +
			"|---|---:|---:|---:|---:|---:|---:|---:|\n"},
		{singles, "| p50 | 120 | 50 | 100 | 1000 | 2.40× | 1.20× | 0.12× |"},
		{singles, "| p99 | 150 | 50 | 100 | 2000 | 3.00× | 1.50× | 0.07× |"},
		{singles, "\nGoals (issue 35): real ÷ fair floor ≤ 1.3× at p50 met (1.20×), at p99 **not met** (1.50×).\n"},
		{singles, "| step, p50 (ms) | real | floor | fair | peer |"},
		{bursts, "| ms | real node | floor (`--node-instant`) | fair floor (`--node-instant-writes`) | peer (kubelet + containerd) | " +
			"ratio real ÷ floor | ratio real ÷ fair floor | ratio real ÷ peer |"},
		{bursts, "| **p50** | 200 | 60 | 180 | 2500 | 3.33× | 1.11× | 0.08× |"},
		{bursts, "| **p99** | 400 | 80 | 350 | 3000 | 5.00× | 1.14× | 0.13× |"},
		{bursts, "Goals (issue 3): p50 ≤ 100 ms **not met** (200 ms)"},
		{bursts, "Goals (issue 35): real ÷ fair floor ≤ 1.3× at p50 met (1.11×), at p99 met (1.14×); " +
			"real ÷ kubelet + containerd ≤ 0.1× at p50 met (0.08×), at p99 **not met** (0.13×).\n"},
		{bursts, "| step | real p50 | real p99 | floor p50 | floor p99 | fair p50 | fair p99 | peer p50 | peer p99 |"},
		{bursts, "| process | real | floor | fair | peer |"},
		{bursts, "| kube-apiserver | 10.0 | 10.0 | 10.0 | 10.0 |"},
		{bursts, "| writes per pod | real | floor | fair | peer |"},
		{bursts, "| pod updates before Running (binding, status) | 0.0 | 0.0 | 2.0 | 0.0 |"},
		{bursts, "| Event Started | – | – | 1.0 | – |"},
		{bursts, "| 1 | fair | third | 180 | 350 |"},
		{bursts, "| 1 | peer | fourth | 2500 | 3000 |"},
		{deploys, "| ms | real node | floor (`--node-instant`) | fair floor (`--node-instant-writes`) | ratio real ÷ floor | ratio real ÷ fair floor |"},
		{deploys, "| **p50** | 300 | 100 | 200 | 3.00× | 1.50× |"},
	} {
		if !strings.Contains(c.part, c.want) {
			t.Errorf("report lacks %q:\n%s", c.want, rep)
		}
	}
	if strings.Contains(singles, "≤ 0.1×") || strings.Contains(deploys, "issue 35") {
		t.Errorf("issue 35's goals belong to the singles (fair floor) and bursts only:\n%s", rep)
	}
}

// A goal is met only by measured figures: a pod never seen Running, or a
// mode with no figure, meets none.
func TestWithin(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		a, b time.Duration
		want bool
	}{{130 * ms, 100 * ms, true}, {131 * ms, 100 * ms, false}, {never, 100 * ms, false}, {100 * ms, never, false}, {100 * ms, -1, false}, {-1, 100 * ms, false}} {
		if got := within(c.a, c.b, 1.3); got != c.want {
			t.Errorf("within(%v, %v, 1.3) = %v", c.a, c.b, got)
		}
	}
}
