package runtimebench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"github.com/k3sm-dev/k3sm/internal/runtime/daemon"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

// TestSandboxCost measures pod start (create → Running, through the
// runtime's watch) with the sandbox and without it, side by side: two
// daemons on two data dirs, rounds alternating, one pod at a time and a
// burst. It prints medians per mode and the difference per pod.
//
//	K3SM_BENCH_RUNTIME=1 go test -count=1 -v -run TestSandboxCost ./bench/runtime/
//
// With K3SM_BENCH_ROOTLESS=1 a third daemon runs as an unprivileged
// account with a subordinate range: the rootless sandbox.
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
	if os.Getenv("K3SM_BENCH_ROOTLESS") != "" {
		// The rootless sandbox: a daemon of an unprivileged account
		// with a subordinate range (this binary, re-executed as it).
		modes = append(modes, mode{"rootless", rootlessDaemon(t, shimBin, ref)})
	}
	for _, m := range []struct {
		name string
		off  bool
	}{{"sandbox", false}, {"no sandbox", true}} {
		c := benchDaemon(t, daemon.Config{ShimPath: shimBin, MaxPods: int64(burst + 10), DisableSandbox: m.off}, ref)
		modes = append(modes, mode{m.name, c})
	}

	seq := 0
	start := func(c *client.Client, n int) []time.Duration { return startPods(t, c, ref, n, &seq) }
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
	q, ms := quantile, msec
	fmt.Printf("pod start, create -> Running (runtime only), %d rounds, modes alternating:\n", rounds)
	for _, m := range modes {
		fmt.Printf("  %-10s one at a time: p50 %s p99 %s (n=%d)   burst of %d: p50 %s p99 %s\n", m.name,
			ms(q(one[m.name], .5)), ms(q(one[m.name], .99)), len(one[m.name]), burst, ms(q(bursts[m.name], .5)), ms(q(bursts[m.name], .99)))
	}
	for _, name := range []string{"sandbox", "rootless"} {
		if len(one[name]) == 0 {
			continue
		}
		fmt.Printf("  %s cost per pod at p50 against no sandbox: one at a time %s, in a burst %s (goal <= 10 ms)\n", name,
			ms(q(one[name], .5)-q(one["no sandbox"], .5)), ms(q(bursts[name], .5)-q(bursts["no sandbox"], .5)))
	}
}

// daemonDirEnv makes this test binary a runtime daemon on that data dir
// (rootlessDaemon runs it as another user).
const daemonDirEnv = "K3SM_BENCH_DAEMON_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(daemonDirEnv); dir != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		err := daemon.Run(ctx, daemon.Config{DataDir: dir, ShimPath: os.Getenv("K3SM_BENCH_SHIM"), MaxPods: 1000})
		if err != nil {
			fmt.Fprintln(os.Stderr, "daemon:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rootlessDaemon starts a runtime daemon as an unprivileged account of
// the test's with a subordinate range, and returns a client with the
// image pulled.
func rootlessDaemon(t *testing.T, shimBin, ref string) *client.Client {
	const user, uid, sub = "k3sm-bench-rootless", 64996, 3_200_000_000
	imagetest.RootlessAccount(t, user, uid, sub)
	bin := t.TempDir()
	os.Chmod(bin, 0o755)
	os.Chmod(filepath.Dir(bin), 0o755)
	imagetest.CopyExecutables(t, bin, os.Args[0], shimBin)
	dir, _ := os.MkdirTemp("", "k3sm-bench")
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, filepath.Base(os.Args[0])), "-test.run=^$")
	cmd.Dir, cmd.Stderr = "/", os.Stderr
	cmd.Env = append(os.Environ(), daemonDirEnv+"="+dir, "K3SM_BENCH_SHIM="+filepath.Join(bin, "k3sm-shim"), "HOME=/")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	c, err := client.Dial(datadir.New(dir).RuntimeSocket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Images.PullImage(ctx, &runtimev1.PullImageRequest{Image: ref}); err != nil {
		t.Fatal(err)
	}
	return c
}

// startPods creates n pods at once on c (uids from *seq on) and returns
// each one's create → Running, seen through the runtime's watch; then
// deletes them.
func startPods(t *testing.T, c *client.Client, ref string, n int, seq *int) []time.Duration {
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
		*seq++
		uid := fmt.Sprintf("bench-%06d", *seq)
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

// benchDaemon runs a runtime daemon in process with cfg on a data dir of
// its own, stopped at the test's end, and returns a client with ref
// pulled.
func benchDaemon(t *testing.T, cfg daemon.Config, ref string) *client.Client {
	dir, _ := os.MkdirTemp("", "k3sm-bench")
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	cfg.DataDir, cfg.OnReady = dir, func() { close(ready) }
	go func() { done <- daemon.Run(ctx, cfg) }()
	<-ready
	c, err := client.Dial(datadir.New(dir).RuntimeSocket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); cancel(); <-done })
	if _, err := c.Images.PullImage(ctx, &runtimev1.PullImageRequest{Image: ref}); err != nil {
		t.Fatal(err)
	}
	return c
}

// quantile is the p quantile of ds (not sorted in place).
func quantile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return pct(s, p)
}

func msec(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
