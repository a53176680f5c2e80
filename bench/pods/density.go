package main

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// nodeWatch samples the node's Ready condition and its lease.
type nodeWatch struct {
	mu            sync.Mutex
	samples       int
	notReady      []string // when and why the node was seen not Ready
	errs          int
	renewals      []time.Time // distinct lease renewTimes seen
	leaseDuration int32
	heartbeats    map[time.Time]bool // distinct Ready lastHeartbeatTimes
	start, end    time.Time
}

func watchNode(ctx context.Context, c kubernetes.Interface, every time.Duration) *nodeWatch {
	w := &nodeWatch{heartbeats: map[time.Time]bool{}, start: time.Now()}
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			w.sample(ctx, c)
			select {
			case <-ctx.Done():
				w.mu.Lock()
				w.end = time.Now()
				w.mu.Unlock()
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *nodeWatch) sample(ctx context.Context, c kubernetes.Interface) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	node, nerr := c.CoreV1().Nodes().Get(sctx, nodeName, metav1.GetOptions{})
	lease, lerr := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(sctx, nodeName, metav1.GetOptions{})
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if nerr != nil || lerr != nil {
		w.errs++
		return
	}
	w.samples++
	ready := false
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.Status == corev1.ConditionTrue
			w.heartbeats[c.LastHeartbeatTime.Time] = true
			if !ready {
				w.notReady = append(w.notReady, fmt.Sprintf("%s: %s %s", time.Now().Format(time.TimeOnly), c.Reason, c.Message))
			}
		}
	}
	if !ready && len(w.notReady) == 0 {
		w.notReady = append(w.notReady, time.Now().Format(time.TimeOnly)+": no Ready condition")
	}
	w.noteLease(lease)
}

func (w *nodeWatch) noteLease(l *coordinationv1.Lease) {
	if l.Spec.LeaseDurationSeconds != nil {
		w.leaseDuration = *l.Spec.LeaseDurationSeconds
	}
	if l.Spec.RenewTime == nil {
		return
	}
	t := l.Spec.RenewTime.Time
	if n := len(w.renewals); n == 0 || !w.renewals[n-1].Equal(t) {
		w.renewals = append(w.renewals, t)
	}
}

// maxGap is the longest time between lease renewals seen, counting the
// time from the last renewal to the end of the watch.
func (w *nodeWatch) maxGap() time.Duration {
	var gap time.Duration
	for i := 1; i < len(w.renewals); i++ {
		gap = max(gap, w.renewals[i].Sub(w.renewals[i-1]))
	}
	if n := len(w.renewals); n > 0 && !w.end.IsZero() {
		gap = max(gap, w.end.Sub(w.renewals[n-1]))
	}
	return gap
}

// densityResult is the density figure.
type densityResult struct {
	Requested, N     int
	Allocatable      int64
	Capped           string
	Overflow         string          // what the scheduler said about one pod more than the node can take
	Lat              []time.Duration // create sent -> Running, sorted
	Stuck            []string        // pods never seen Running, and why
	Span             time.Duration   // first create sent -> last Running
	SpanSeen         time.Duration   // the same over the pods seen Running
	Before, After    map[string]mem  // k3sm processes by role (median of samples)
	Shims, Workloads []mem
	PerPodKB         float64
	DiskPerPodKB     float64 // <data>/pods per pod (pod roots are copies on ext4)
	StillRunning     int     // pods Running with no restart at the end of the hold
	Node             *nodeWatch
	Delete           time.Duration // delete sent -> gone from the API
	Clean            time.Duration // delete sent -> no process or directory left
	Residue          []string
	Load             string
}

// memSample reads every process of s once.
func (b *bench) memSample(s *server) (roles map[string]mem, shims, workloads []mem) {
	roles = map[string]mem{}
	for _, p := range classify(scan(), s.pid(), b.bin, b.shim, s.dir) {
		m, err := readMem(p.Pid)
		if err != nil {
			continue
		}
		switch p.Role {
		case "k3sm-shim":
			shims = append(shims, m)
		case "workload":
			workloads = append(workloads, m)
		default:
			roles[p.Role] = roles[p.Role].add(m)
		}
	}
	return roles, shims, workloads
}

// memMedian samples k times, every gap, and keeps per role the sample
// with the median PSS; shims and workloads come from the last sample.
func (b *bench) memMedian(s *server, k int, gap time.Duration) (map[string]mem, []mem, []mem) {
	var samples []map[string]mem
	var shims, workloads []mem
	for i := range k {
		if i > 0 {
			time.Sleep(gap)
		}
		var r map[string]mem
		r, shims, workloads = b.memSample(s)
		samples = append(samples, r)
	}
	out := map[string]mem{}
	for role := range samples[len(samples)-1] {
		var ms []mem
		for _, s := range samples {
			if m, ok := s[role]; ok {
				ms = append(ms, m)
			}
		}
		sort.Slice(ms, func(i, j int) bool { return ms[i].PSS < ms[j].PSS })
		out[role] = ms[len(ms)/2]
	}
	return out, shims, workloads
}

func dirSize(root string) int64 {
	var n int64
	filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// density runs as many pods as asked (at most what the node has room for)
// of the sleeping test program on the real server, watching the node's
// readiness and lease throughout, reads memory, then deletes them all.
func (b *bench) density(ctx context.Context, s *server) (*densityResult, error) {
	d := &densityResult{Requested: b.o.density, Load: loadAvg()}
	node, err := s.c.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	d.Allocatable = node.Status.Allocatable.Pods().Value()
	onNode, err := s.c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName})
	if err != nil {
		return nil, err
	}
	used := 0
	for _, p := range onNode.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			used++
		}
	}
	d.N = d.Requested
	if free := int(d.Allocatable) - used; free < d.N {
		d.N = max(free, 0)
		d.Capped = fmt.Sprintf("the node's allocatable pods is %d (%d in use), so %d of the %d requested pods were run",
			d.Allocatable, used, d.N, d.Requested)
		fmt.Printf("bench/pods: density capped: %s\n", d.Capped)
	}
	if d.N == 0 {
		return d, fmt.Errorf("density: the node has no room for pods (%s)", d.Capped)
	}

	sleep(ctx, b.o.settle)
	d.Before, _, _ = b.memMedian(s, 3, 2*time.Second)

	mctx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	d.Node = watchNode(mctx, s.c, time.Second)

	const label = "density"
	sel := "bench=" + label
	list, err := s.c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	t := newTracker(d.N)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watchPods(wctx, s.c, sel, list.ResourceVersion, t.observe)
	err = createPods(ctx, s.c, t, d.N, b.o.creators, func(i int) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("density-%04d", i), Labels: map[string]string{"bench": label}},
			Spec: podSpec(b.image, nodeName, "forever")}
	})
	if err != nil {
		return nil, err
	}
	all, err := t.wait(ctx, b.o.timeout, b.o.stall)
	if err != nil {
		return nil, err
	}
	allRunning := time.Now()
	if !all {
		d.Stuck = t.stuck(s.dir)
		fmt.Printf("bench/pods: density: %s; stuck: %s\n", t.summary(), strings.Join(d.Stuck, "; "))
	}
	r := burstResult{N: d.N}
	r.fill(t.snapshot())
	d.Lat, d.Span, d.SpanSeen = r.Lat, r.Span, r.SpanSeen
	stopWatch()
	fmt.Printf("bench/pods: density: %d pods, all Running after %s\n", d.N, ms(d.Span))

	if d.Capped != "" {
		d.Overflow = b.overflow(ctx, s, label)
	}

	// Let start-up garbage settle, then read memory; keep the pods running
	// for the rest of the hold while the node is watched.
	sleep(ctx, min(10*time.Second, b.o.hold))
	d.After, d.Shims, d.Workloads = b.memMedian(s, 3, 2*time.Second)
	var shimPSS int64
	for _, m := range d.Shims {
		shimPSS += m.PSS
	}
	growth := d.After["runtimed"].PSS - d.Before["runtimed"].PSS + d.After["node"].PSS - d.Before["node"].PSS
	d.PerPodKB = float64(shimPSS+growth) / float64(d.N)
	d.DiskPerPodKB = float64(dirSize(filepath.Join(s.dir, "pods"))) / 1024 / float64(d.N)
	sleep(ctx, time.Until(allRunning.Add(b.o.hold)))
	if err := s.alive(); err != nil {
		return nil, err
	}
	pods, err := s.c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount == 0 {
			d.StillRunning++
		}
	}

	del := time.Now()
	if err := s.c.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel}); err != nil {
		return nil, err
	}
	err = poll(ctx, b.o.timeout, 250*time.Millisecond, func() error {
		l, err := s.c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err == nil && len(l.Items) > 0 {
			err = fmt.Errorf("%d pods left", len(l.Items))
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("density: delete: %w", err)
	}
	d.Delete = time.Since(del)
	// Whatever is left a minute after the API forgot the pods is residue.
	_ = poll(ctx, time.Minute, 250*time.Millisecond, func() error {
		if d.Residue = b.residue(s); len(d.Residue) > 0 {
			return fmt.Errorf("residue")
		}
		return nil
	})
	d.Clean = time.Since(del)
	stopMonitor()
	// The monitor records its end when it sees the cancellation.
	poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
		d.Node.mu.Lock()
		defer d.Node.mu.Unlock()
		if d.Node.end.IsZero() {
			return fmt.Errorf("monitor running")
		}
		return nil
	})
	return d, nil
}

// overflow creates one pod more than the node can take and returns what
// the scheduler says about it (it is deleted with the others).
func (b *bench) overflow(ctx context.Context, s *server, label string) string {
	name := "density-overflow"
	_, err := s.c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": label}},
		Spec: podSpec(b.image, nodeName, "forever")}, metav1.CreateOptions{})
	if err != nil {
		return "creating one pod more failed: " + err.Error()
	}
	var said string
	err = poll(ctx, 30*time.Second, 200*time.Millisecond, func() error {
		p, err := s.c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled {
				said = fmt.Sprintf("PodScheduled=%s %s: %s", c.Status, c.Reason, c.Message)
				if c.Status == corev1.ConditionFalse {
					return nil
				}
			}
		}
		return fmt.Errorf("not reported unschedulable")
	})
	if err != nil {
		return fmt.Sprintf("one pod more: %s (%v)", said, err)
	}
	return said
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
