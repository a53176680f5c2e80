package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

const ns = "default"

// never stands for a pod that was never seen Running.
const never = time.Duration(math.MaxInt64)

// podSpec is a pod that selects this node's OS and tolerates its taint
// (as test/e2e's nativeSpec), pinned to node (the real node and the peer
// share a control plane), running the test program with args.
func podSpec(image, node string, args ...string) corev1.PodSpec {
	return corev1.PodSpec{
		NodeSelector: map[string]string{"kubernetes.io/os": "linux", corev1.LabelHostname: node},
		Tolerations:  []corev1.Toleration{{Key: "k3sm.io/provider", Operator: corev1.TolerationOpExists}},
		Containers:   []corev1.Container{{Name: "main", Image: image, Args: args}},
	}
}

// podTimes are one pod's timestamps. All clocks are this machine's: the
// benchmark's for the API side, the runtime daemon's (pod.json) for
// admitted and started.
type podTimes struct {
	name, uid string
	sent      time.Time // create request about to be sent (Deployment: the Deployment's)
	created   time.Time // create call returned (Deployment: first watch event of the pod)
	scheduled time.Time // first watch event with spec.nodeName set
	running   time.Time // first watch event with phase Running and Ready=True
	admitted  time.Time // runtime: CreatePod accepted (pod.json startTime)
	started   time.Time // runtime: container process started (pod.json)
	updates   int       // writes to the pod seen through the watch until it was Running
}

// tracker follows pods through a watch.
type tracker struct {
	mu          sync.Mutex
	pods        map[string]*podTimes
	defaultSent time.Time // for pods the benchmark did not create itself
	want        int
	running     int
	done        chan struct{}
	last        map[string]string // last phase/reason per pod, for diagnostics
}

func newTracker(want int) *tracker {
	return &tracker{pods: map[string]*podTimes{}, want: want, done: make(chan struct{}), last: map[string]string{}}
}

func (t *tracker) get(name string) *podTimes {
	p := t.pods[name]
	if p == nil {
		p = &podTimes{name: name, sent: t.defaultSent}
		t.pods[name] = p
	}
	return p
}

func (t *tracker) markSent(name string, at time.Time) {
	t.mu.Lock()
	t.get(name).sent = at
	t.mu.Unlock()
}

func (t *tracker) markCreated(name string, at time.Time) {
	t.mu.Lock()
	p := t.get(name)
	if p.created.IsZero() {
		p.created = at
	}
	t.mu.Unlock()
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (t *tracker) observe(typ watch.EventType, pod *corev1.Pod, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if typ == watch.Deleted {
		return
	}
	p := t.get(pod.Name)
	p.uid = string(pod.UID)
	if p.created.IsZero() {
		p.created = at
	}
	if p.scheduled.IsZero() && pod.Spec.NodeName != "" {
		p.scheduled = at
	}
	desc := string(pod.Status.Phase)
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			desc += "/" + w.Reason
		}
	}
	t.last[pod.Name] = desc
	if p.running.IsZero() && typ == watch.Modified {
		p.updates++
	}
	if p.running.IsZero() && pod.Status.Phase == corev1.PodRunning && podReady(pod) {
		p.running = at
		t.running++
		if t.running == t.want {
			close(t.done)
		}
	}
}

// wait waits until every pod is Running and Ready, timeout passes, or no
// pod became Running for stall. It reports whether all made it; a pod the
// node never reports Running is a finding, not a reason to stop measuring.
func (t *tracker) wait(ctx context.Context, timeout, stall time.Duration) (bool, error) {
	deadline := time.After(timeout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, lastChange := -1, time.Now()
	for {
		select {
		case <-t.done:
			return true, nil
		case <-deadline:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		case <-tick.C:
			t.mu.Lock()
			n := t.running
			t.mu.Unlock()
			if n != last {
				last, lastChange = n, time.Now()
			} else if time.Since(lastChange) > stall {
				return false, nil
			}
		}
	}
}

// stuck describes the pods never seen Running: their last state in the
// API and, on the real node, in the runtime.
func (t *tracker) stuck(dataDir string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for name, p := range t.pods {
		if !p.running.IsZero() {
			continue
		}
		d := fmt.Sprintf("%s: API %s", name, t.last[name])
		if dataDir != "" && p.uid != "" {
			if _, started, err := runtimePodTimes(dataDir, p.uid); err != nil {
				d += "; runtime: " + err.Error()
			} else if !started.IsZero() {
				d += fmt.Sprintf("; runtime: process running since %s, %s after it was scheduled",
					started.UTC().Format("15:04:05.000"), started.Sub(p.scheduled).Round(time.Millisecond))
			} else {
				d += "; runtime: not started"
			}
		}
		out = append(out, d)
	}
	if missing := t.want - len(t.pods); missing > 0 {
		out = append(out, fmt.Sprintf("%d pods never created", missing))
	}
	sort.Strings(out)
	return out
}

// summary says how many pods are in which state, for timeouts.
func (t *tracker) summary() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	count := map[string]int{}
	for _, d := range t.last {
		count[d]++
	}
	var parts []string
	for d, n := range count {
		parts = append(parts, fmt.Sprintf("%d %s", n, d))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d of %d Running and Ready; seen: %s", t.running, t.want, strings.Join(parts, ", "))
}

func (t *tracker) snapshot() []podTimes {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]podTimes, 0, len(t.pods))
	for _, p := range t.pods {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// watchPods follows the pods matching sel from resource version rv until
// ctx ends, re-watching from the last version seen if the stream closes.
// Each event is stamped when this process receives it.
func watchPods(ctx context.Context, c kubernetes.Interface, sel, rv string, f func(watch.EventType, *corev1.Pod, time.Time)) {
	for ctx.Err() == nil {
		w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		for ev := range w.ResultChan() {
			at := time.Now()
			switch o := ev.Object.(type) {
			case *corev1.Pod:
				rv = o.ResourceVersion
				if ev.Type != watch.Bookmark {
					f(ev.Type, o, at)
				}
			case *metav1.Status:
				if o.Code == 410 { // expired: start over; first-seen times stay
					rv = ""
				}
			}
		}
		w.Stop()
	}
}

// createPods creates pods name(i) for i < n from workers goroutines, as
// fast as the client allows, recording when each request is sent.
func createPods(ctx context.Context, c kubernetes.Interface, t *tracker, n, workers int, mk func(i int) *corev1.Pod) error {
	idx := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				pod := mk(i)
				t.markSent(pod.Name, time.Now())
				_, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
				if err != nil {
					errs <- fmt.Errorf("create %s: %w", pod.Name, err)
					continue
				}
				t.markCreated(pod.Name, time.Now())
			}
		}()
	}
	for i := range n {
		idx <- i
	}
	close(idx)
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	return nil
}

// burstResult is one round of one mode.
type burstResult struct {
	Mode     string // real, floor, fair, peer or upstreamRatesMode
	Kind     string // single, pods or deployment
	Round    int
	Order    int // 1: this mode ran first in its round
	N        int
	Lat      []time.Duration // create sent -> Running and Ready, sorted
	Span     time.Duration   // first create sent -> last pod Running
	SpanSeen time.Duration   // the same over the pods that were seen Running
	Created  []time.Duration // sent -> pod exists (create call returned / first event)
	ToSched  []time.Duration // sent -> scheduled
	SchedRun []time.Duration // scheduled -> Running
	// Real mode, from the runtime's pod.json:
	SchedAdmit   []time.Duration          // scheduled -> runtime CreatePod
	AdmitStart   []time.Duration          // runtime CreatePod -> process started
	StartRunning []time.Duration          // process started -> Running seen through the watch
	StartRate    float64                  // real: pods started per second, first CreatePod -> last process started
	TailRate     float64                  // pods seen Running per second over the second half of the burst
	Stuck        []string                 // pods never seen Running, and why
	Updates      float64                  // pod writes seen through the watch until Running, per pod
	Events       map[string]float64       // Events about the pods, per pod, by reason (until they were gone)
	Delete       time.Duration            // delete sent -> pods gone from the API (and, real: from the node)
	CPU          map[string]time.Duration // CPU time used by each process role from the first create to the last Running
	Load         string                   // load average before the round
}

// runtimePodTimes reads when the runtime admitted the pod and started its
// container, from <data>/pods/<uid>/pod.json.
func runtimePodTimes(dataDir, uid string) (admitted, started time.Time, err error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "pods", uid, "pod.json"))
	if err != nil {
		return admitted, started, err
	}
	var pp struct {
		StartTime  time.Time `json:"startTime"`
		Containers []struct {
			State struct {
				Running *struct {
					StartedAt time.Time `json:"startedAt"`
				} `json:"running"`
			} `json:"state"`
		} `json:"containers"`
	}
	if err := json.Unmarshal(b, &pp); err != nil {
		return admitted, started, err
	}
	admitted = pp.StartTime
	for _, c := range pp.Containers {
		if c.State.Running != nil && c.State.Running.StartedAt.After(started) {
			started = c.State.Running.StartedAt
		}
	}
	return admitted, started, nil
}

func sorted(ds []time.Duration) []time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds
}

// fill computes the result's series from the pods' timestamps.
func (r *burstResult) fill(pods []podTimes) {
	var first, last time.Time
	missing := max(r.N-len(pods), 0) // never even created (Deployment)
	for _, p := range pods {
		if first.IsZero() || p.sent.Before(first) {
			first = p.sent
		}
		if p.running.After(last) {
			last = p.running
		}
		if !p.created.IsZero() {
			r.Created = append(r.Created, p.created.Sub(p.sent))
		}
		if !p.scheduled.IsZero() {
			r.ToSched = append(r.ToSched, p.scheduled.Sub(p.sent))
		}
		if p.running.IsZero() {
			missing++
			continue
		}
		r.Lat = append(r.Lat, p.running.Sub(p.sent))
		r.SchedRun = append(r.SchedRun, p.running.Sub(p.scheduled))
		if !p.admitted.IsZero() && !p.started.IsZero() {
			r.SchedAdmit = append(r.SchedAdmit, p.admitted.Sub(p.scheduled))
			r.AdmitStart = append(r.AdmitStart, p.started.Sub(p.admitted))
			r.StartRunning = append(r.StartRunning, p.running.Sub(p.started))
		}
	}
	r.Span = last.Sub(first)
	r.SpanSeen = r.Span
	if len(pods) > 0 {
		n := 0
		for _, p := range pods {
			n += p.updates
		}
		r.Updates = float64(n) / float64(len(pods))
	}
	// A pod never seen Running counts as never: the percentiles it
	// reaches are unbounded.
	for range missing {
		r.Lat = append(r.Lat, never)
		r.Span = never
	}
	var firstAdmit, lastStart time.Time
	var runs []time.Time
	for _, p := range pods {
		if !p.admitted.IsZero() && (firstAdmit.IsZero() || p.admitted.Before(firstAdmit)) {
			firstAdmit = p.admitted
		}
		if p.started.After(lastStart) {
			lastStart = p.started
		}
		runs = append(runs, p.running)
	}
	if !firstAdmit.IsZero() && lastStart.After(firstAdmit) {
		r.StartRate = float64(len(pods)) / lastStart.Sub(firstAdmit).Seconds()
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].Before(runs[j]) })
	if n := len(runs); n >= 4 && runs[n-1].After(runs[n/2]) {
		r.TailRate = float64(n-1-n/2) / runs[n-1].Sub(runs[n/2]).Seconds()
	}
	for _, s := range [][]time.Duration{r.Lat, r.Created, r.ToSched, r.SchedRun, r.SchedAdmit, r.AdmitStart, r.StartRunning} {
		sorted(s)
	}
}

// burst creates n pods (kind "pods") or a Deployment of n replicas (kind
// "deployment") on s, waits until every pod is Running and Ready as seen
// through a watch, then deletes them and waits until they are gone.
func (b *bench) burst(ctx context.Context, s *server, kind string, round int) (*burstResult, error) {
	n := b.o.pods
	if kind == "single" {
		n = 1
	}
	label := fmt.Sprintf("%s-%s-r%d", kind, s.mode, round)
	sel := "bench=" + label
	r := &burstResult{Mode: s.mode, Kind: kind, Round: round, N: n, Load: loadAvg()}
	list, err := s.c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	t := newTracker(n)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watchPods(wctx, s.c, sel, list.ResourceVersion, t.observe)
	labels := map[string]string{"bench": label}
	cpu0 := b.cpu(s)

	switch kind {
	case "pods", "single":
		err = createPods(ctx, s.c, t, n, b.o.creators, func(i int) *corev1.Pod {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%03d", label, i), Labels: labels},
				Spec: podSpec(b.image, s.node, "forever")}
		})
	case "deployment":
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: label, Labels: labels},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To(int32(n)),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: podSpec(b.image, s.node, "forever")},
			},
		}
		t.mu.Lock()
		t.defaultSent = time.Now()
		t.mu.Unlock()
		_, err = s.c.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, err
	}
	all, err := t.wait(ctx, b.o.timeout, b.o.stall)
	if err != nil {
		return nil, err
	}
	if !all {
		dir := ""
		if !s.instant && s.peer == nil {
			dir = s.dir
		}
		r.Stuck = t.stuck(dir)
		fmt.Printf("bench/pods: %s %s round %d: %s; stuck: %s\n", s.mode, kind, round, t.summary(), strings.Join(r.Stuck, "; "))
	}
	cpu1 := b.cpu(s)
	r.CPU = map[string]time.Duration{}
	for role, t1 := range cpu1 {
		r.CPU[role] = t1 - cpu0[role]
	}
	pods := t.snapshot()
	if !s.instant && s.peer == nil {
		for i := range pods {
			pods[i].admitted, pods[i].started, _ = runtimePodTimes(s.dir, pods[i].uid)
		}
	}
	r.fill(pods)
	stopWatch()

	del := time.Now()
	if kind == "deployment" {
		err = s.c.AppsV1().Deployments(ns).Delete(ctx, label, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	} else {
		err = s.c.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel})
	}
	if err != nil {
		return nil, fmt.Errorf("delete %s: %w", label, err)
	}
	if err := b.waitGone(ctx, s, sel); err != nil {
		return nil, err
	}
	r.Delete = time.Since(del)
	// Events are written asynchronously (and the node's client is rate
	// limited): count once the count stops changing.
	var last float64 = -1
	_ = poll(ctx, 30*time.Second, time.Second, func() error {
		r.Events = eventsPerPod(ctx, s.c, pods)
		var sum float64
		for _, v := range r.Events {
			sum += v
		}
		if sum != last {
			last = sum
			return fmt.Errorf("events still arriving")
		}
		return nil
	})
	return r, nil
}

// eventsPerPod counts the Events about pods, by reason, per pod.
func eventsPerPod(ctx context.Context, c kubernetes.Interface, pods []podTimes) map[string]float64 {
	if len(pods) == 0 {
		return nil
	}
	names := map[string]bool{}
	for _, p := range pods {
		names[p.name] = true
	}
	l, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod"})
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for _, e := range l.Items {
		if names[e.InvolvedObject.Name] {
			out[e.Reason] += float64(max(e.Count, 1)) / float64(len(pods))
		}
	}
	return out
}

// waitGone waits until no pod matches sel and, on the real node, no shim,
// workload or pod directory is left.
func (b *bench) waitGone(ctx context.Context, s *server, sel string) error {
	err := poll(ctx, b.o.timeout, 250*time.Millisecond, func() error {
		l, err := s.c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d pods left", len(l.Items))
		}
		if s.peer != nil {
			if left := s.peer.residue(); len(left) > 0 {
				return fmt.Errorf("left on the peer: %s", strings.Join(left, "; "))
			}
		} else if !s.instant {
			if left := b.residue(s); len(left) > 0 {
				return fmt.Errorf("left on the node: %s", strings.Join(left, "; "))
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: deleting %s: %w", s.mode, sel, err)
	}
	return nil
}

// cpu is the CPU time used so far by the processes serving s, by role.
// The peer's are the kubelet, containerd, its shims and containers, and
// the control plane it shares (the real server's processes).
func (b *bench) cpu(s *server) map[string]time.Duration {
	if s.peer == nil {
		return cpuByRole(classify(scan(), s.pid(), b.bin, b.shim, s.dir))
	}
	all := scan()
	var ps []proc
	for _, p := range classify(all, s.cp.pid(), b.bin, b.shim, s.cp.dir) {
		if p.Role != "k3sm-shim" && p.Role != "workload" {
			ps = append(ps, p)
		}
	}
	return cpuByRole(append(ps, s.peer.classify(all)...))
}

// residue lists what is left of deleted pods on the real node: shim and
// workload processes, pod directories, log directories, shim sockets.
func (b *bench) residue(s *server) []string {
	var left []string
	ps := classify(scan(), s.pid(), b.bin, b.shim, s.dir)
	if n := countRole(ps, "k3sm-shim"); n > 0 {
		left = append(left, fmt.Sprintf("%d k3sm-shim processes", n))
	}
	if n := countRole(ps, "workload"); n > 0 {
		left = append(left, fmt.Sprintf("%d workload processes", n))
	}
	for _, d := range []string{"pods", filepath.Join("logs", "pods"), filepath.Join("run", "shims")} {
		entries, err := os.ReadDir(filepath.Join(s.dir, d))
		if err == nil && len(entries) > 0 {
			left = append(left, fmt.Sprintf("%d entries in %s/", len(entries), d))
		}
	}
	return left
}

// warmUp runs one pod to Running and deletes it, so the image is pulled
// and unpacked before anything is timed.
func (b *bench) warmUp(ctx context.Context, s *server) error {
	name := "warmup-" + s.mode
	_, err := s.c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": name}},
		Spec: podSpec(b.image, s.node, "forever")}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	err = poll(ctx, 3*time.Minute, 100*time.Millisecond, func() error {
		p, err := s.c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning || !podReady(p) {
			return fmt.Errorf("phase %s %+v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: warm-up pod: %w", s.mode, err)
	}
	if err := s.c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return b.waitGone(ctx, s, "bench="+name)
}
