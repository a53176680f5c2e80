package pod

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

func ctr(name string, cpuReq, cpuLim, memReq, memLim int64) *runtimev1.ContainerSpec {
	return &runtimev1.ContainerSpec{Name: name, Resources: &runtimev1.Resources{CpuRequestMillis: cpuReq, CpuLimitMillis: cpuLim,
		MemoryRequestBytes: memReq, MemoryLimitBytes: memLim}}
}

func sidecar(c *runtimev1.ContainerSpec) *runtimev1.ContainerSpec {
	c.RestartPolicy = runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS
	return c
}

func TestPodResources(t *testing.T) {
	const mi = 1 << 20
	for _, c := range []struct {
		name string
		spec *runtimev1.PodSpec
		want cgroups.Resources
		qos  string
	}{
		{"best effort", &runtimev1.PodSpec{Containers: []*runtimev1.ContainerSpec{ctr("a", 0, 0, 0, 0)}},
			cgroups.Resources{}, qosBestEffort},
		{"sum of containers", &runtimev1.PodSpec{Containers: []*runtimev1.ContainerSpec{ctr("a", 100, 200, 32*mi, 64*mi), ctr("b", 50, 100, 16*mi, 32*mi)}},
			cgroups.Resources{CPURequestMillis: 150, CPULimitMillis: 300, MemoryLimitBytes: 96 * mi}, qosBurstable},
		{"one container without limits: no pod limit", &runtimev1.PodSpec{Containers: []*runtimev1.ContainerSpec{ctr("a", 100, 200, 0, 64*mi), ctr("b", 50, 0, 0, 0)}},
			cgroups.Resources{CPURequestMillis: 150}, qosBurstable},
		{"guaranteed", &runtimev1.PodSpec{Containers: []*runtimev1.ContainerSpec{ctr("a", 500, 500, 64*mi, 64*mi)}},
			cgroups.Resources{CPURequestMillis: 500, CPULimitMillis: 500, MemoryLimitBytes: 64 * mi}, qosGuaranteed},
		{"request defaults to limit", &runtimev1.PodSpec{Containers: []*runtimev1.ContainerSpec{ctr("a", 0, 500, 0, 64*mi)}},
			cgroups.Resources{CPULimitMillis: 500, MemoryLimitBytes: 64 * mi}, qosGuaranteed},
		{"a bigger init container", &runtimev1.PodSpec{InitContainers: []*runtimev1.ContainerSpec{ctr("i", 1000, 2000, 0, 512*mi)},
			Containers: []*runtimev1.ContainerSpec{ctr("a", 100, 200, 0, 64*mi)}},
			cgroups.Resources{CPURequestMillis: 1000, CPULimitMillis: 2000, MemoryLimitBytes: 512 * mi}, qosBurstable},
		{"sidecars add up, and to later init containers", &runtimev1.PodSpec{
			InitContainers: []*runtimev1.ContainerSpec{sidecar(ctr("s", 100, 100, 0, 100*mi)), ctr("i", 300, 300, 0, 300*mi)},
			Containers:     []*runtimev1.ContainerSpec{ctr("a", 100, 100, 0, 100*mi)}},
			cgroups.Resources{CPURequestMillis: 400, CPULimitMillis: 400, MemoryLimitBytes: 400 * mi}, qosGuaranteed},
	} {
		if got := podResources(c.spec); got != c.want {
			t.Errorf("%s: podResources = %+v, want %+v", c.name, got, c.want)
		}
		if got := qosClass(c.spec); got != c.qos {
			t.Errorf("%s: qosClass = %s, want %s", c.name, got, c.qos)
		}
	}
	if niceFor(qosBestEffort) != 19 || niceFor(qosGuaranteed) != 0 || niceFor(qosBurstable) <= 0 {
		t.Error("BestEffort must get the lowest priority, Guaranteed the daemon's")
	}
}

// groupProc is a Process over a real child leading its own process group.
type groupProc struct{ cmd *exec.Cmd }

func (g groupProc) Pid() int             { return g.cmd.Process.Pid }
func (g groupProc) StartedAt() time.Time { return time.Time{} }
func (g groupProc) Signal(s syscall.Signal) error {
	return syscall.Kill(-g.cmd.Process.Pid, s)
}
func (g groupProc) Wait(context.Context) (ExitStatus, error) { return ExitStatus{}, g.cmd.Wait() }

func startGroup(t *testing.T, script string) groupProc {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	return groupProc{cmd}
}

func TestSamplerKillsOverMemoryAndReportsOOMKilled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the sampler reads /proc here")
	}
	m := &Manager{log: slog.New(slog.DiscardHandler), pods: map[string]*managedPod{}}
	p := &managedPod{m: m, uid: "u1", name: "p", namespace: "ns"}
	// tail of /dev/zero never sees a newline: its buffer grows until
	// something stops it. A child in the group holds it, so the sum over
	// the group is what counts.
	g := startGroup(t, "tail /dev/zero; true")
	small := startGroup(t, "sleep 100")
	targets := []sampleTarget{{p: p, name: "hog", id: "k3sm://hog", proc: g, limit: 32 << 20},
		{p: p, name: "small", id: "k3sm://small", proc: small, limit: 32 << 20}}
	// A sample every 100 ms, not every poll.Interval: each reads the
	// group's /proc.
	poll.Every(t, context.Background(), 10*time.Second, 100*time.Millisecond, "the sampler to kill a process group far over its limit", func() error {
		if err := m.killOverMemory(targets); err != nil {
			t.Fatal(err)
		}
		if syscall.Kill(g.Pid(), 0) != nil || processState(g.Pid()) == "Z" {
			return nil
		}
		return fmt.Errorf("group %d still runs", g.Pid())
	})
	g.cmd.Wait()
	if ws := g.cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
		t.Errorf("the group leader ended with %v, not SIGKILL", g.cmd.ProcessState)
	}
	if processState(small.Pid()) == "" {
		t.Error("the sampler killed a container under its limit")
	}
	c := &container{name: "hog", containerID: "k3sm://hog", spec: ctr("hog", 0, 0, 0, 32<<20)}
	term := &terminated{ExitCode: 137, Signal: 9, Reason: "Error"}
	p.noteOOM(c, term)
	if term.Reason != "OOMKilled" || term.ExitCode != 137 || !strings.Contains(term.Message, "33554432") {
		t.Errorf("terminated %+v, want OOMKilled, 137", term)
	}
	// Reported once: the next attempt's exit is its own.
	term = &terminated{ExitCode: 1, Reason: "Error"}
	p.noteOOM(c, term)
	if term.Reason != "Error" {
		t.Errorf("second attempt: %+v", term)
	}
}

func TestSamplerRenicesByQoS(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads the priority from /proc")
	}
	g := startGroup(t, "sleep 100 & sleep 100")
	var s resourceState
	s.renice([]sampleTarget{{name: "be", id: "k3sm://be", proc: g, nice: niceFor(qosBestEffort)}}, slog.New(slog.DiscardHandler))
	if n := niceOf(t, g.Pid()); n != 19 {
		t.Errorf("BestEffort container's nice is %d, want 19", n)
	}
	s.renice(nil, slog.New(slog.DiscardHandler))
	if len(s.niced) != 0 {
		t.Errorf("ended attempts are not forgotten: %v", s.niced)
	}
}

// processState is field 3 of /proc/<pid>/stat ("" once gone).
func processState(pid int) string {
	f := statFields(pid)
	if len(f) < 1 {
		return ""
	}
	return f[0]
}

func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(b), ')')
	return strings.Fields(string(b[i+1:]))
}

func niceOf(t *testing.T, pid int) int {
	f := statFields(pid)
	if len(f) < 17 {
		t.Fatalf("no stat for %d", pid)
	}
	n, _ := strconv.Atoi(f[16]) // field 19
	return n
}

// The pod's total of a resource, as Kubernetes' resource helpers count it
// (the pod's cgroup limits and eviction's request).
func TestPodTotal(t *testing.T) {
	mem := func(v int64) *runtimev1.Resources { return &runtimev1.Resources{MemoryRequestBytes: v} }
	ctr := func(vs ...int64) (out []*runtimev1.ContainerSpec) {
		for _, v := range vs {
			out = append(out, &runtimev1.ContainerSpec{Resources: mem(v)})
		}
		return out
	}
	sidecar := func(v int64) *runtimev1.ContainerSpec {
		return &runtimev1.ContainerSpec{Resources: mem(v), RestartPolicy: runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS}
	}
	for _, tc := range []struct {
		name  string
		ctrs  []*runtimev1.ContainerSpec
		inits []*runtimev1.ContainerSpec
		want  int64
	}{
		{"containers add up", ctr(10, 20), nil, 30},
		{"a larger init container wins", ctr(10, 20), ctr(50), 50},
		{"a smaller init container does not", ctr(10, 20), ctr(5), 30},
		{"sidecars add to the containers", ctr(10), []*runtimev1.ContainerSpec{sidecar(7)}, 17},
		{"an init after a sidecar runs beside it", ctr(10), append([]*runtimev1.ContainerSpec{sidecar(7)}, ctr(40)...), 47},
		{"an init before a sidecar does not", ctr(10), append(ctr(40), sidecar(7)), 40},
	} {
		spec := &runtimev1.PodSpec{Containers: tc.ctrs, InitContainers: tc.inits}
		if got := PodTotal(spec, (*runtimev1.Resources).GetMemoryRequestBytes); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// The LimitNotEnforced message names each limit the kernel does not hold
// the container to, and why; nothing when it holds them all.
func TestUnenforcedLimits(t *testing.T) {
	const mi = 1 << 20
	none := cgroups.Support{Cause: cgroups.CauseNotMounted, Reason: "no cgroup hierarchy is mounted", Fix: "mount cgroup2"}
	memOnly := cgroups.Support{Version: cgroups.V1, Enforced: []string{cgroups.Memory, cgroups.Pids}, Cause: cgroups.CauseNoController, Reason: "not available: cpu"}
	all := cgroups.Support{Version: cgroups.V2, Enforced: []string{cgroups.CPU, cgroups.Memory, cgroups.Pids}}
	for _, c := range []struct {
		r       *runtimev1.Resources
		s       cgroups.Support
		want    []string
		without []string
	}{
		{ctr("a", 100, 100, 0, 64*mi).Resources, none, []string{"CPU limit 100m is not enforced", "memory limit 64Mi is not held by the kernel", ": no cgroup hierarchy is mounted", "k3sm doctor"}, nil},
		{ctr("a", 0, 1500, 0, 0).Resources, memOnly, []string{"CPU limit 1500m is not enforced", "): not available: cpu"}, []string{"memory", "k3sm doctor"}},
		{ctr("a", 0, 0, 0, 100_000_000).Resources, memOnly, nil, nil},
		{ctr("a", 0, 0, 0, 100_000_000).Resources, none, []string{"memory limit 100000000 is"}, []string{"CPU"}},
		{ctr("a", 100, 200, 0, 64*mi).Resources, all, nil, nil},
		{ctr("a", 100, 0, 0, 0).Resources, none, nil, nil}, // a request is not a limit
	} {
		got := unenforcedLimits(c.r, c.s)
		if (got == "") != (len(c.want) == 0) {
			t.Errorf("%v under %+v: %q", c.r, c.s, got)
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%v under %+v: %q lacks %q", c.r, c.s, got, w)
			}
		}
		for _, w := range c.without {
			if strings.Contains(got, w) {
				t.Errorf("%v under %+v: %q has %q", c.r, c.s, got, w)
			}
		}
	}
	// As the API writes quantities: 1000 bytes is 1k there too.
	for b, want := range map[int64]string{64 << 20: "64Mi", 1 << 30: "1Gi", 1536: "1536", 3 << 10: "3Ki", 1000: "1k",
		64 << 10: "64Ki", 1 << 50: "1Pi", 100_000_000: "100000000"} {
		if got := binaryQuantity(b); got != want {
			t.Errorf("binaryQuantity(%d) = %s, want %s", b, got, want)
		}
	}
}
