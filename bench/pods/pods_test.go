package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
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
	}
	got := map[int]string{}
	for _, p := range classify(all, 10, bin, shim, data) {
		got[p.Pid] = p.Role
	}
	want := map[int]string{10: "server", 11: "kube-apiserver", 12: "runtimed", 13: "k3sm-shim", 14: "workload", 15: "k3sm-shim", 18: "true"}
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

func TestWriteSectionKeepsOtherSections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "RESULTS.md")
	other := "# Results\n\n<!-- bench/controlplane: begin -->\n## Control plane\n<!-- bench/controlplane: end -->\n"
	os.WriteFile(path, []byte(other), 0o644)
	if err := writeSection(path, "## Pods (issue 3)\nfirst\n"); err != nil {
		t.Fatal(err)
	}
	if err := writeSection(path, "## Pods (issue 3)\nsecond\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	s := string(b)
	want := other + "\n" + beginMark + "\n## Pods (issue 3)\nsecond\n" + endMark + "\n"
	if s != want {
		t.Errorf("got:\n%s\nwant:\n%s", s, want)
	}
}

func TestServerArgsLoopbackOnly(t *testing.T) {
	args := strings.Join(serverArgs("/d", []int{1, 2, 3, 4}, true, "--max-pods", "510"), " ")
	for _, want := range []string{"--bind-address 127.0.0.1", "--advertise-address 127.0.0.1", "--https-listen-port 1",
		"--scheduler-port 2", "--controller-manager-port 3", "--kubelet-port 4", "--node-instant", "--max-pods 510"} {
		if !strings.Contains(args, want) {
			t.Errorf("%q lacks %q", args, want)
		}
	}
	if strings.Contains(strings.Join(serverArgs("/d", []int{1, 2, 3, 4}, false), " "), "instant") {
		t.Error("the real server must not get --node-instant")
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
	// Burn CPU until the kernel's own 10 ms ticks say 50 ms were used.
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
