package runtimebench

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"github.com/k3sm-dev/k3sm/internal/runtime/daemon"
)

// TestCgroupBirthCost measures pod start (create → Running) with each
// container's init created in its cgroup by the kernel (CLONE_INTO_CGROUP,
// cgroup v2) against moved there after it was created, side by side: two
// daemons on two data dirs and two cgroup subtrees, rounds alternating,
// one pod at a time and a burst. Needs root on cgroup v2, which this
// project's machines are not: test/vm runs it in the test VM.
//
//	K3SM_VM_BENCH=1 go test -count=1 -v -run TestBenchCgroupBirth ./test/vm/
func TestCgroupBirthCost(t *testing.T) {
	if os.Getenv("K3SM_BENCH_RUNTIME") == "" {
		t.Skip("set K3SM_BENCH_RUNTIME=1 to run")
	}
	if os.Geteuid() != 0 {
		t.Skip("the sandbox and cgroups need root")
	}
	if s := cgroups.Detect(cgroups.Options{Name: "k3sm-bench-probe"}); s.Version != cgroups.V2 {
		t.Skipf("needs cgroup v2: %s", s.Describe())
	}
	rounds, serial, burst := 3, 15, 20
	shimBin, ref := shimAndImage(t)
	type mode struct {
		name string
		c    *client.Client
	}
	var modes []mode
	for _, m := range []struct {
		name string
		join bool
	}{{"born", false}, {"joined", true}} {
		cg := cgroups.Options{Name: "k3sm-bench-" + m.name}
		t.Cleanup(func() { cgroups.New(cg).Remove() })
		c := benchDaemon(t, daemon.Config{ShimPath: shimBin, MaxPods: int64(burst + 10), Cgroups: cg, JoinCgroupsAfterStart: m.join}, ref)
		modes = append(modes, mode{m.name, c})
	}
	seq := 0
	one := map[string][]time.Duration{}
	bursts := map[string][]time.Duration{}
	for r := 0; r < rounds; r++ {
		for _, m := range modes {
			for i := 0; i < serial; i++ {
				one[m.name] = append(one[m.name], startPods(t, m.c, ref, 1, &seq)...)
			}
			bursts[m.name] = append(bursts[m.name], startPods(t, m.c, ref, burst, &seq)...)
		}
	}
	q, ms := quantile, msec
	attach, _ := cgroups.ReadAttachMode("/proc/self/mountinfo")
	fmt.Printf("pod start, create -> Running (runtime only, sandboxed), %d rounds, modes alternating; %s:\n", rounds, attach.Describe())
	for _, m := range modes {
		fmt.Printf("  %-7s one at a time: p50 %s p99 %s (n=%d)   burst of %d: p50 %s p99 %s\n", m.name,
			ms(q(one[m.name], .5)), ms(q(one[m.name], .99)), len(one[m.name]), burst, ms(q(bursts[m.name], .5)), ms(q(bursts[m.name], .99)))
	}
	fmt.Printf("  born / joined at p50: one at a time %.2f, in a burst %.2f\n",
		float64(q(one["born"], .5))/float64(q(one["joined"], .5)), float64(q(bursts["born"], .5))/float64(q(bursts["joined"], .5)))
}
