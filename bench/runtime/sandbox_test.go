package runtimebench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"github.com/k3sm-dev/k3sm/internal/runtime/daemon"
)

// TestSandboxCost measures pod start (create → Running, through the
// runtime's watch) with the sandbox and without it, side by side: two
// daemons on two data dirs, rounds alternating, one pod at a time and a
// burst. It prints medians per mode and the difference per pod.
//
//	K3SM_BENCH_RUNTIME=1 go test -count=1 -v -run TestSandboxCost ./bench/runtime/
func TestSandboxCost(t *testing.T) {
	if os.Getenv("K3SM_BENCH_RUNTIME") == "" {
		t.Skip("set K3SM_BENCH_RUNTIME=1 to run")
	}
	if os.Geteuid() != 0 {
		t.Skip("the sandbox needs root")
	}
	burst, rounds, serial := 100, 3, 20
	if v, err := strconv.Atoi(os.Getenv("K3SM_BENCH_BURST")); err == nil && v > 0 {
		burst = v
	}
	shimBin, ref := shimAndImage(t)

	type mode struct {
		name string
		c    *client.Client
	}
	var modes []mode
	for _, m := range []struct {
		name string
		off  bool
	}{{"sandbox", false}, {"no sandbox", true}} {
		dir, _ := os.MkdirTemp("", "k3sm-bench")
		t.Cleanup(func() { os.RemoveAll(dir) })
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- daemon.Run(ctx, daemon.Config{DataDir: dir, ShimPath: shimBin, MaxPods: int64(burst + 10), DisableSandbox: m.off,
				OnReady: func() { close(ready) }})
		}()
		<-ready
		c, err := client.Dial(datadir.New(dir).RuntimeSocket())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); cancel(); <-done })
		if _, err := c.Images.PullImage(ctx, &runtimev1.PullImageRequest{Image: ref}); err != nil {
			t.Fatal(err)
		}
		modes = append(modes, mode{m.name, c})
	}

	seq := 0
	// start creates n pods at once and returns each one's create → Running.
	start := func(c *client.Client, n int) []time.Duration {
		ctx := context.Background()
		stream, err := c.Runtime.WatchPodStatus(ctx, &runtimev1.WatchPodStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		created := map[string]time.Time{}
		lat := make(chan time.Duration, n)
		go func() {
			seen := map[string]bool{}
			for {
				m, err := stream.Recv()
				if err != nil {
					return
				}
				st := m.GetStatus()
				if st == nil || seen[st.GetUid()] || st.GetPhase() != runtimev1.PodPhase_POD_PHASE_RUNNING {
					continue
				}
				mu.Lock()
				t0, ok := created[st.GetUid()]
				mu.Unlock()
				if ok {
					seen[st.GetUid()] = true
					lat <- time.Since(t0)
				}
			}
		}()
		var uids []string
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			seq++
			uid := fmt.Sprintf("bench-%06d", seq)
			uids = append(uids, uid)
			wg.Add(1)
			go func() {
				defer wg.Done()
				mu.Lock()
				created[uid] = time.Now()
				mu.Unlock()
				if _, err := c.Runtime.CreatePod(ctx, &runtimev1.CreatePodRequest{Pod: benchPod(uid, ref)}); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		ds := collect(t, lat, n, 3*time.Minute)
		zero := int64(0)
		for _, uid := range uids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.Runtime.DeletePod(ctx, &runtimev1.DeletePodRequest{Uid: uid, GracePeriodSeconds: &zero, Wait: true})
			}()
		}
		wg.Wait()
		return ds
	}
	one := map[string][]time.Duration{}
	bursts := map[string][]time.Duration{}
	for r := 0; r < rounds; r++ {
		for _, m := range modes {
			for i := 0; i < serial; i++ {
				one[m.name] = append(one[m.name], start(m.c, 1)...)
			}
			bursts[m.name] = append(bursts[m.name], start(m.c, burst)...)
		}
	}
	q := func(ds []time.Duration, p float64) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return pct(s, p)
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	fmt.Printf("pod start, create -> Running (runtime only), %d rounds, modes alternating:\n", rounds)
	for _, m := range modes {
		fmt.Printf("  %-10s one at a time: p50 %s p99 %s (n=%d)   burst of %d: p50 %s p99 %s\n", m.name,
			ms(q(one[m.name], .5)), ms(q(one[m.name], .99)), len(one[m.name]), burst, ms(q(bursts[m.name], .5)), ms(q(bursts[m.name], .99)))
	}
	fmt.Printf("  sandbox cost per pod at p50: one at a time %s, in a burst %s (goal <= 10 ms)\n",
		ms(q(one["sandbox"], .5)-q(one["no sandbox"], .5)), ms(q(bursts["sandbox"], .5)-q(bursts["no sandbox"], .5)))
}
