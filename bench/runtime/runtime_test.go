// Package runtimebench measures the runtime daemon on its own (no control
// plane): pod create -> Running latency over a burst, and memory per pod
// beyond the workload (shim + daemon state).
//
//	K3SM_BENCH_RUNTIME=1 K3SM_BENCH_PODS=500 go test -v -run TestRuntimeDensity ./bench/runtime/
package runtimebench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"github.com/k3sm-dev/k3sm/internal/runtime/daemon"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	"github.com/k3sm-dev/k3sm/internal/runtime/shim"
)

func smaps(pid int) (rss, pss int) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 {
			v, _ := strconv.Atoi(fs[1])
			switch fs[0] {
			case "Rss:":
				rss = v
			case "Pss:":
				pss = v
			}
		}
	}
	return rss, pss
}

func pct(d []time.Duration, p float64) time.Duration {
	return d[int(float64(len(d)-1)*p)]
}

// benchPod is the pod both benchmarks start: the test program, forever.
func benchPod(uid, ref string) *runtimev1.PodSpec {
	return &runtimev1.PodSpec{Uid: uid, Namespace: "bench", Name: uid,
		Containers: []*runtimev1.ContainerSpec{{Name: "main", Image: ref, ImagePullPolicy: runtimev1.PullPolicy_PULL_POLICY_IF_NOT_PRESENT, Args: []string{"forever"}}}}
}

// collect takes n latencies from lat, failing the test when one takes
// longer than timeout to come.
func collect(t *testing.T, lat <-chan time.Duration, n int, timeout time.Duration) []time.Duration {
	var ds []time.Duration
	for len(ds) < n {
		select {
		case d := <-lat:
			ds = append(ds, d)
		case <-time.After(timeout):
			t.Fatalf("only %d of %d pods Running", len(ds), n)
		}
	}
	return ds
}

// shimAndImage builds the shim (static, as `make` does: the sandbox runs
// it inside pod roots) and the test image, served from a local registry.
func shimAndImage(t *testing.T) (shimBin, ref string) {
	// Prebuilt where there is no Go toolchain (the test VM: test/vm).
	shimBin, prog := os.Getenv("K3SM_RUNTIME_TEST_SHIM_BIN"), os.Getenv("K3SM_RUNTIME_TEST_PROG_BIN")
	if shimBin == "" || prog == "" {
		bin := t.TempDir()
		shimBin = filepath.Join(bin, "k3sm-shim")
		build := exec.Command("go", "build", "-o", shimBin, "github.com/k3sm-dev/k3sm/cmd/k3sm-shim")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		var err error
		if prog, err = imagetest.BuildProg(bin); err != nil {
			t.Fatal(err)
		}
	}
	reg := imagetest.StartRegistry(t, "", "")
	img, _ := imagetest.Image(prog, v1.Platform{})
	return shimBin, reg.Push(t, "prog:v1", img)
}

func TestRuntimeDensity(t *testing.T) {
	if os.Getenv("K3SM_BENCH_RUNTIME") == "" {
		t.Skip("set K3SM_BENCH_RUNTIME=1 (and K3SM_BENCH_PODS=N, default 100) to run")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	n := 100
	if v, err := strconv.Atoi(os.Getenv("K3SM_BENCH_PODS")); err == nil && v > 0 {
		n = v
	}
	shimBin, ref := shimAndImage(t)

	dir, _ := os.MkdirTemp("", "k3sm")
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, daemon.Config{DataDir: dir, ShimPath: shimBin, MaxPods: int64(n + 10), OnReady: func() { close(ready) }})
	}()
	<-ready
	c, err := client.Dial(datadir.New(dir).RuntimeSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer lcancel()
		zero := int64(0)
		r, _ := c.Runtime.ListPods(lctx, &runtimev1.ListPodsRequest{})
		var wg sync.WaitGroup
		for _, p := range r.GetPods() {
			wg.Add(1)
			go func(uid string) {
				defer wg.Done()
				c.Runtime.DeletePod(lctx, &runtimev1.DeletePodRequest{Uid: uid, GracePeriodSeconds: &zero, Wait: true})
			}(p.GetUid())
		}
		wg.Wait()
		c.Close()
		cancel()
		<-done
	}()
	if _, err := c.Images.PullImage(ctx, &runtimev1.PullImageRequest{Image: ref}); err != nil {
		t.Fatal(err)
	}
	info, _ := c.Runtime.GetRuntimeInfo(ctx, &runtimev1.GetRuntimeInfoRequest{})

	runtime.GC()
	time.Sleep(time.Second)
	selfBefore, _ := smaps(os.Getpid())

	stream, err := c.Runtime.WatchPodStatus(ctx, &runtimev1.WatchPodStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	created := map[string]time.Time{}
	var mu sync.Mutex
	lat := make(chan time.Duration, n)
	startedLat := make(chan time.Duration, n)
	go func() {
		seen := map[string]bool{}
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if ev := m.GetEvent(); ev != nil && ev.GetReason() == "Started" {
				mu.Lock()
				startedLat <- ev.GetTime().AsTime().Sub(created[ev.GetPodUid()])
				mu.Unlock()
			}
			st := m.GetStatus()
			if st == nil || seen[st.GetUid()] || st.GetPhase() != runtimev1.PodPhase_POD_PHASE_RUNNING {
				continue
			}
			now := time.Now()
			mu.Lock()
			t0, ok := created[st.GetUid()]
			mu.Unlock()
			if ok {
				seen[st.GetUid()] = true
				lat <- now.Sub(t0)
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			uid := fmt.Sprintf("bench-%05d", i)
			mu.Lock()
			created[uid] = time.Now()
			mu.Unlock()
			_, err := c.Runtime.CreatePod(ctx, &runtimev1.CreatePodRequest{Pod: benchPod(uid, ref)})
			if err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	ds := collect(t, lat, n, 2*time.Minute)
	all := time.Since(start)
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	var ss []time.Duration
	for len(ss) < n {
		ss = append(ss, <-startedLat)
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i] < ss[j] })

	time.Sleep(3 * time.Second) // let shims and workloads settle
	runtime.GC()
	selfAfter, _ := smaps(os.Getpid())
	var shimRSS, shimPSS, wlRSS, wlPSS int
	for i := 0; i < n; i++ {
		uid := fmt.Sprintf("bench-%05d", i)
		st, err := c.Runtime.GetPodStatus(ctx, &runtimev1.GetPodStatusRequest{Uid: uid})
		if err != nil {
			t.Fatal(err)
		}
		cs := st.GetStatus().GetContainerStatuses()[0]
		if cs.GetRestartCount() != 0 || cs.GetState().GetRunning() == nil {
			t.Errorf("pod %s did not stay running: %v", uid, cs)
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "pods", uid, "attempts", "main", "0", shim.PidFile))
		if err != nil {
			t.Fatal(err)
		}
		var r shim.Response
		json.Unmarshal(b, &r)
		a, b2 := smaps(r.ShimPid)
		shimRSS, shimPSS = shimRSS+a, shimPSS+b2
		a, b2 = smaps(r.Pid)
		wlRSS, wlPSS = wlRSS+a, wlPSS+b2
	}
	daemonDelta := selfAfter - selfBefore
	t.Logf("clone method %s, %d pods burst-created in %s", info.GetCloneMethod(), n, all.Round(time.Millisecond))
	t.Logf("create -> Running (watch): p50 %s  p90 %s  p99 %s  max %s", pct(ds, 0.5).Round(time.Millisecond),
		pct(ds, 0.9).Round(time.Millisecond), pct(ds, 0.99).Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
	t.Logf("create -> Started event (daemon clock): p50 %s  p90 %s  p99 %s", pct(ss, 0.5).Round(time.Millisecond),
		pct(ss, 0.9).Round(time.Millisecond), pct(ss, 0.99).Round(time.Millisecond))
	t.Logf("per pod: shim RSS %d kB PSS %d kB; daemon RSS growth %d kB; workload RSS %d kB PSS %d kB",
		shimRSS/n, shimPSS/n, daemonDelta/n, wlRSS/n, wlPSS/n)
	t.Logf("memory per pod beyond the workload (shim PSS + daemon growth): %d kB", (shimPSS+daemonDelta)/n)
}
