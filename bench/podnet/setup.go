//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/netd/client"
	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/server"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

// A setup path, in the order of the report's columns.
const (
	setupNetd   = iota // client → unix socket → k3sm-netd (one mutex) → dataplane
	setupDirect        // the dataplane's AddPod/DelPod, called in this process
	nSetups
)

var setupNames = [nSetups]string{"k3sm-netd (client → server → dataplane)", "dataplane directly"}

// burst is one burst of AddPods on one path.
type burst struct {
	calls   []time.Duration // each call, from its start to its return
	ready   []time.Duration // each pod, from the burst's start to its call's return
	wall    time.Duration   // the burst's start to the last return
	delWall time.Duration   // tearing the burst's pods down, same workers
}

type setupResult struct {
	add, del [nSetups][]time.Duration // one pod at a time
	bursts   [nSetups][]burst
}

// podOps is what a path can do to a pod.
type podOps interface {
	add(ctx context.Context, i int) error
	del(ctx context.Context, i int) error
}

// netdOps goes through the real server and client, as the runtime does.
type netdOps struct {
	c   *client.Client
	tag int
}

func uid(tag, i int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", tag, i) }

func (n *netdOps) add(ctx context.Context, i int) error {
	_, err := n.c.SetupPod(ctx, uid(n.tag, i), "bench", fmt.Sprintf("pod-%d", i))
	return err
}

func (n *netdOps) del(ctx context.Context, i int) error {
	return n.c.TeardownPod(ctx, uid(n.tag, i))
}

// directOps calls the dataplane with the address netd would have chosen
// (pod i gets .2+i; no traffic flows in this part, and each path's pods
// are gone before the other's start).
type directOps struct {
	dp       dataplane.Dataplane
	netnsDir string
	tag      int
}

func (d *directOps) pod(i int) dataplane.Pod {
	ip := node.Gateway.Next()
	for range i {
		ip = ip.Next()
	}
	u := uid(d.tag, i)
	return dataplane.Pod{UID: u, IP: ip, NetNS: filepath.Join(d.netnsDir, u), HostIf: dataplane.HostIfName(u)}
}

func (d *directOps) add(_ context.Context, i int) error { return d.dp.AddPod(node, d.pod(i)) }
func (d *directOps) del(_ context.Context, i int) error { return d.dp.DelPod(d.pod(i)) }

// setupBench starts a k3sm-netd server (the real internal/netd/server,
// over the real dataplane, in the host namespace) and measures pod network
// setup through it and through the dataplane directly.
func setupBench(ctx context.Context, dir, hostNS string, o options) (_ *setupResult, err error) {
	netdNetNS := filepath.Join(dir, "netd-netns")
	newDP := func(netnsDir string) (dataplane.Dataplane, error) {
		return dataplane.New(dataplane.Options{HostNSPath: hostNS, NetNSDir: netnsDir})
	}
	srv, err := server.Start(server.Config{
		Socket:       filepath.Join(dir, "netd", "netd.sock"),
		StateFile:    filepath.Join(dir, "netd-state.json"),
		NetNSDir:     netdNetNS,
		AllowedUID:   os.Getuid(),
		NewDataplane: func() (dataplane.Dataplane, error) { return newDP(netdNetNS) },
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	directNetNS := filepath.Join(dir, "direct-netns")
	dp, err := newDP(directNetNS)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := dp.DelNode(node); derr != nil && err == nil {
			err = fmt.Errorf("DelNode: %w", derr)
		}
	}()
	c := client.New(filepath.Join(dir, "netd", "netd.sock"))
	if _, err := c.ConfigureRanges(ctx, wire.ConfigureArgs{
		PodCIDR: node.CIDR.String(), ServiceCIDR: node.ServiceCIDR.String(), ClusterCIDR: node.ClusterCIDR.String(),
	}); err != nil {
		return nil, fmt.Errorf("Configure: %w", err)
	}

	r := &setupResult{}
	tag := 0
	ops := func(path int) podOps {
		tag++
		if path == setupNetd {
			return &netdOps{c: c, tag: tag}
		}
		return &directOps{dp: dp, netnsDir: directNetNS, tag: tag}
	}

	// One pod at a time, the paths alternating.
	singles := [nSetups]podOps{ops(setupNetd), ops(setupDirect)}
	for i := range o.pods {
		for k := range nSetups {
			path := (i + k) % nSetups
			t0 := time.Now()
			if err := singles[path].add(ctx, i); err != nil {
				return nil, fmt.Errorf("%s: add pod %d: %w", setupNames[path], i, err)
			}
			t1 := time.Now()
			if err := singles[path].del(ctx, i); err != nil {
				return nil, fmt.Errorf("%s: delete pod %d: %w", setupNames[path], i, err)
			}
			r.add[path] = append(r.add[path], t1.Sub(t0))
			r.del[path] = append(r.del[path], time.Since(t1))
		}
	}
	fmt.Fprintf(os.Stderr, "one at a time: %d pods per path done\n", o.pods)

	// Bursts: all pods from o.workers goroutines, then all torn down.
	for i := range o.burstRounds {
		for k := range nSetups {
			path := (i + k) % nSetups
			b, err := runBurst(ctx, ops(path), o.pods, o.workers)
			if err != nil {
				return nil, fmt.Errorf("%s: burst: %w", setupNames[path], err)
			}
			r.bursts[path] = append(r.bursts[path], b)
			fmt.Fprintf(os.Stderr, "burst %d %-42s %d pods in %v (teardown %v)\n", i+1, setupNames[path], o.pods, b.wall.Round(time.Millisecond), b.delWall.Round(time.Millisecond))
		}
	}
	if pods, err := c.ListPods(ctx); err != nil || len(pods) != 0 {
		return nil, fmt.Errorf("k3sm-netd still lists %d pods after the bursts (%v)", len(pods), err)
	}
	return r, nil
}

func runBurst(ctx context.Context, ops podOps, n, workers int) (burst, error) {
	b := burst{calls: make([]time.Duration, n), ready: make([]time.Duration, n)}
	run := func(f func(i int) error) error {
		next := make(chan int)
		errs := make([]error, workers)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range next {
					if err := f(i); err != nil && errs[w] == nil {
						errs[w] = fmt.Errorf("pod %d: %w", i, err)
					}
				}
			})
		}
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
		return errors.Join(errs...)
	}
	t0 := time.Now()
	addErr := run(func(i int) error {
		c0 := time.Now()
		err := ops.add(ctx, i)
		b.calls[i], b.ready[i] = time.Since(c0), time.Since(t0)
		return err
	})
	b.wall = time.Since(t0)
	t1 := time.Now()
	// Every pod is torn down, also after a failed add: nothing is left.
	delErr := run(func(i int) error {
		if err := ops.del(ctx, i); err != nil && !client.IsNotFound(err) {
			return err
		}
		return nil
	})
	b.delWall = time.Since(t1)
	return b, errors.Join(addErr, delErr)
}

// pct is the q-quantile (0 < q ≤ 1) of ds by nearest rank (p99 of 100
// is the 99th smallest); it sorts a copy.
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	rank := int(math.Ceil(q * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}
