package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
)

// fakeRuntime is the runtime daemon as the provider sees it: pods created
// and deleted by uid, errors injected per call, and an event log replayed as
// the daemon does (events of this boot after the position asked for).
type fakeRuntime struct {
	runtimev1.RuntimeClient // calls not faked panic

	mu      sync.Mutex
	live    map[string]bool // uid -> created and not deleted
	creates int
	// createErr, when set, answers CreatePod (before it takes effect).
	createErr func(n int) error
	// createGate, when set, is waited on inside CreatePod after the pod
	// was created (a slow daemon).
	createGate chan struct{}
	createdCh  chan string
	bootID     string
	events     []*runtimev1.PodEvent
	watches    []*runtimev1.WatchPodStatusRequest
	statuses   []*runtimev1.PodStatus
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{live: map[string]bool{}, createdCh: make(chan string, 100), bootID: "boot-1"}
}

func (f *fakeRuntime) client() *client.Client { return &client.Client{Runtime: f} }

func (f *fakeRuntime) CreatePod(ctx context.Context, in *runtimev1.CreatePodRequest, _ ...grpc.CallOption) (*runtimev1.CreatePodResponse, error) {
	f.mu.Lock()
	f.creates++
	n := f.creates
	if f.createErr != nil {
		if err := f.createErr(n); err != nil {
			f.mu.Unlock()
			return nil, err
		}
	}
	if f.live[in.Pod.Uid] {
		f.mu.Unlock()
		return nil, status.Error(codes.AlreadyExists, "exists")
	}
	f.live[in.Pod.Uid] = true
	gate := f.createGate
	f.mu.Unlock()
	f.createdCh <- in.Pod.Uid
	if gate != nil {
		<-gate
	}
	return &runtimev1.CreatePodResponse{}, nil
}

// UpdatePod and UpdatePodVolumes refuse an unknown pod, as the daemon does.
func (f *fakeRuntime) UpdatePod(_ context.Context, in *runtimev1.UpdatePodRequest, _ ...grpc.CallOption) (*runtimev1.UpdatePodResponse, error) {
	if !f.isLive(in.GetPod().GetUid()) {
		return nil, status.Error(codes.NotFound, "no such pod")
	}
	return &runtimev1.UpdatePodResponse{}, nil
}

func (f *fakeRuntime) UpdatePodVolumes(_ context.Context, in *runtimev1.UpdatePodVolumesRequest, _ ...grpc.CallOption) (*runtimev1.UpdatePodVolumesResponse, error) {
	if !f.isLive(in.GetUid()) {
		return nil, status.Error(codes.NotFound, "no such pod")
	}
	return &runtimev1.UpdatePodVolumesResponse{}, nil
}

func (f *fakeRuntime) DeletePod(_ context.Context, in *runtimev1.DeletePodRequest, _ ...grpc.CallOption) (*runtimev1.DeletePodResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.live[in.Uid] {
		return nil, status.Error(codes.NotFound, "no such pod")
	}
	delete(f.live, in.Uid)
	return &runtimev1.DeletePodResponse{}, nil
}

func (f *fakeRuntime) ListPods(context.Context, *runtimev1.ListPodsRequest, ...grpc.CallOption) (*runtimev1.ListPodsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &runtimev1.ListPodsResponse{Pods: f.statuses}, nil
}

func (f *fakeRuntime) isLive(uid string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live[uid]
}

func (f *fakeRuntime) WatchPodStatus(ctx context.Context, in *runtimev1.WatchPodStatusRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[runtimev1.WatchPodStatusResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watches = append(f.watches, in)
	after := in.EventsAfterSeq
	if in.EventsBootId != f.bootID {
		after = 0
	}
	var msgs []*runtimev1.WatchPodStatusResponse
	for _, st := range f.statuses {
		msgs = append(msgs, &runtimev1.WatchPodStatusResponse{Kind: runtimev1.WatchPodStatusResponse_KIND_INITIAL, Status: st, BootId: f.bootID})
	}
	for _, e := range f.events {
		if e.Seq > after {
			msgs = append(msgs, &runtimev1.WatchPodStatusResponse{Kind: runtimev1.WatchPodStatusResponse_KIND_EVENT, Event: e, BootId: f.bootID})
		}
	}
	return &fakeStream{ctx: ctx, msgs: msgs}, nil
}

type fakeStream struct {
	grpc.ClientStream
	ctx  context.Context
	msgs []*runtimev1.WatchPodStatusResponse
}

func (s *fakeStream) Recv() (*runtimev1.WatchPodStatusResponse, error) {
	if len(s.msgs) > 0 {
		m := s.msgs[0]
		s.msgs = s.msgs[1:]
		return m, nil
	}
	<-s.ctx.Done()
	return nil, io.EOF
}

// fakeSource has the ConfigMaps in cms and nothing else.
type fakeSource struct {
	cms map[string]*corev1.ConfigMap
}

func (f fakeSource) ConfigMap(_ context.Context, _, name string) (*corev1.ConfigMap, error) {
	if cm, ok := f.cms[name]; ok {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func (fakeSource) Secret(_ context.Context, _, name string) (*corev1.Secret, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func (fakeSource) Claim(_ context.Context, _, name string) (*corev1.PersistentVolumeClaim, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "persistentvolumeclaims"}, name)
}

func (fakeSource) Volume(_ context.Context, name string) (*corev1.PersistentVolume, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "persistentvolumes"}, name)
}

func (fakeSource) ClusterTrustBundles(context.Context, string, labels.Selector) ([]certificatesv1.ClusterTrustBundle, error) {
	return nil, nil
}

func (fakeSource) ClusterTrustBundle(_ context.Context, name string) (*certificatesv1.ClusterTrustBundle, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "certificates.k8s.io", Resource: "clustertrustbundles"}, name)
}

func (fakeSource) Token(_ context.Context, _, sa string, _ *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return nil, apierrors.NewForbidden(schema.GroupResource{Resource: "serviceaccounts/token"}, sa, errors.New("no tokens"))
}

// flakySource answers from fakeSource, or with fail's error while it
// returns one.
type flakySource struct {
	fakeSource
	mu   sync.Mutex
	fail func() error
}

func (f *flakySource) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail == nil {
		return nil
	}
	return f.fail()
}

func (f *flakySource) setFail(fn func() error) {
	f.mu.Lock()
	f.fail = fn
	f.mu.Unlock()
}

func (f *flakySource) ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	if err := f.err(); err != nil {
		return nil, err
	}
	return f.fakeSource.ConfigMap(ctx, ns, name)
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func cmPod(uid string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: types.UID(uid)},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "img"}},
			Volumes:    []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}}},
		}}
}

func drain(events chan string) []string {
	var out []string
	for {
		select {
		case e := <-events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A transient runtime error (the daemon restarting answers Unavailable) is
// retried with backoff until the pod is created, once.
func TestCreateRetriesTransientRuntimeError(t *testing.T) {
	rt := newFakeRuntime()
	rt.createErr = func(n int) error {
		if n <= 2 {
			return status.Error(codes.Unavailable, "connection refused")
		}
		return nil
	}
	src := &flakySource{fakeSource: fakeSource{cms: map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"k": "v"}}}}}
	p := newProvider(rt.client(), podspec.New(podspec.Config{Source: src}), "127.0.0.1", nil, quiet(), false)
	if err := p.CreatePod(context.Background(), cmPod("u1")); err != nil {
		// Virtual Kubelet would retry, but finds the pod known (GetPod)
		// and never calls CreatePod again: the provider must own the retry.
		t.Logf("CreatePod: %v", err)
	}
	poll.Until(t, 20*time.Second, "pod created after the runtime came back", func() bool { return rt.isLive("u1") })
	time.Sleep(100 * time.Millisecond)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.creates != 3 {
		t.Fatalf("%d CreatePod calls, want 3 (two refused, one that took)", rt.creates)
	}
}

// A retry timer that fires while DeletePod runs must not leave the pod
// running in the runtime, and must not share the provider's pod with
// DeletePod (run with -race).
func TestRetryDoesNotRecreateDeletedPod(t *testing.T) {
	rt := newFakeRuntime()
	rt.createGate = make(chan struct{})
	src := &flakySource{fakeSource: fakeSource{cms: map[string]*corev1.ConfigMap{}}}
	p := newProvider(rt.client(), podspec.New(podspec.Config{Source: src}), "127.0.0.1", nil, quiet(), false)
	p.retryDelay = 50 * time.Millisecond
	pod := cmPod("u1")
	// The ConfigMap is missing: FailedMount, retry later.
	if err := p.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	src.cms["cm"] = &corev1.ConfigMap{Data: map[string]string{"k": "v"}}
	src.mu.Unlock()
	// The retry creates the pod; the daemon is slow to answer, and the pod
	// is deleted meanwhile.
	select {
	case <-rt.createdCh:
	case <-time.After(20 * time.Second):
		t.Fatal("retry never started the pod")
	}
	del := pod.DeepCopy()
	now := metav1.Now()
	del.DeletionTimestamp = &now
	del.DeletionGracePeriodSeconds = new(int64)
	done := make(chan error, 1)
	go func() { done <- p.DeletePod(context.Background(), del) }()
	time.Sleep(200 * time.Millisecond) // DeletePod is under way
	close(rt.createGate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // any further retry would have fired
	if rt.isLive("u1") {
		t.Fatal("the pod runs in the runtime after DeletePod returned")
	}
}

// A retry scheduled before DeletePod never fires after it.
func TestDeleteCancelsRetry(t *testing.T) {
	rt := newFakeRuntime()
	src := &flakySource{fakeSource: fakeSource{cms: map[string]*corev1.ConfigMap{}}}
	p := newProvider(rt.client(), podspec.New(podspec.Config{Source: src}), "127.0.0.1", nil, quiet(), false)
	p.retryDelay = 100 * time.Millisecond
	pod := cmPod("u1")
	if err := p.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	src.cms["cm"] = &corev1.ConfigMap{Data: map[string]string{"k": "v"}}
	src.mu.Unlock()
	if err := p.DeletePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	// A late create from Virtual Kubelet's queue, too.
	_ = p.CreatePod(context.Background(), pod)
	// A pod that is not deleted, whose retry is scheduled after every
	// retry u1 could have (same delay): once its retry has created it,
	// u1's would have fired too; its pod lock, held by a retry while it
	// runs, is then free only once such a retry has finished.
	other := cmPod("u2")
	other.Name = "q"
	other.Spec.Volumes[0].ConfigMap.Name = "cm2"
	if err := p.CreatePod(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	src.cms["cm2"] = &corev1.ConfigMap{Data: map[string]string{"k": "v"}}
	src.mu.Unlock()
	poll.Until(t, 20*time.Second, "the pod not deleted created by its retry", func() bool { return rt.isLive("u2") })
	p.podLocks.lock(pod.UID)()
	if rt.isLive("u1") {
		t.Fatal("a deleted pod was created")
	}
}

// An API hiccup while a running pod is re-adopted (the node restarted) must
// not make it ContainerCreating, nor post FailedMount.
func TestTransientAPIErrorKeepsRunningPod(t *testing.T) {
	rt := newFakeRuntime()
	src := &flakySource{fakeSource: fakeSource{cms: map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"k": "v"}}}}}
	src.setFail(func() error { return apierrors.NewServiceUnavailable("etcd leader changed") })
	events := record.NewFakeRecorder(100)
	p := newProvider(rt.client(), podspec.New(podspec.Config{Source: src}), "127.0.0.1", events, quiet(), false)
	rec := &recorder{last: map[string]*corev1.Pod{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.NotifyPods(ctx, rec.notify)
	st := running("u1", 3)
	st.ContainerStatuses = []*runtimev1.ContainerStatus{{Name: "c", Ready: true, Started: true,
		State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{}}}}}
	p.update(st) // what the runtime runs, learnt before Virtual Kubelet asks
	if err := p.CreatePod(ctx, cmPod("u1")); err != nil {
		t.Fatal(err)
	}
	for _, timeout := range []error{
		apierrors.NewTimeoutError("slow", 1),
		errors.New(`Get "https://127.0.0.1:6443/api/v1/namespaces/default/configmaps/cm": dial tcp 127.0.0.1:6443: connect: connection refused`),
		apierrors.NewInternalError(errors.New("boom")),
	} {
		src.setFail(func() error { return timeout })
		if err := p.CreatePod(ctx, cmPod("u1")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	got, err := p.GetPod(ctx, "default", "p")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodRunning || got.Status.ContainerStatuses[0].State.Running == nil {
		t.Fatalf("running pod now %s %+v", got.Status.Phase, got.Status.ContainerStatuses)
	}
	if last := rec.get("p"); last != nil && last.Status.Phase != corev1.PodRunning {
		t.Fatalf("notified %s", last.Status.Phase)
	}
	for _, e := range drain(events.Events) {
		if strings.Contains(e, "FailedMount") || strings.Contains(e, "Failed ") {
			t.Fatalf("event %q for an API hiccup", e)
		}
	}
}

// For a pod not started yet an API hiccup is retried, not a FailedMount or
// a CreateContainerConfigError.
func TestTransientAPIErrorRetriesStart(t *testing.T) {
	rt := newFakeRuntime()
	src := &flakySource{fakeSource: fakeSource{cms: map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"k": "v"}}}}}
	src.setFail(func() error { return apierrors.NewServiceUnavailable("apiserver shutting down") })
	events := record.NewFakeRecorder(100)
	p := newProvider(rt.client(), podspec.New(podspec.Config{Source: src}), "127.0.0.1", events, quiet(), false)
	pod := cmPod("u1")
	pod.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}}
	if err := p.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	got, _ := p.GetPod(context.Background(), "default", "p")
	for _, cs := range got.Status.ContainerStatuses {
		if w := cs.State.Waiting; w == nil || w.Reason != "ContainerCreating" {
			t.Fatalf("container state %+v", cs.State)
		}
	}
	src.setFail(nil)
	poll.Until(t, 20*time.Second, "pod started once the API answers", func() bool { return rt.isLive("u1") })
	for _, e := range drain(events.Events) {
		if strings.Contains(e, "FailedMount") || strings.Contains(e, "CreateContainerConfigError") || strings.Contains(e, "Warning Failed ") {
			t.Fatalf("event %q for an API hiccup", e)
		}
	}
	// A real error is still one.
	src.setFail(func() error { return apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, "cm") })
	events2 := record.NewFakeRecorder(100)
	p2 := newProvider(rt.client(), podspec.New(podspec.Config{Source: src}), "127.0.0.1", events2, quiet(), false)
	if err := p2.CreatePod(context.Background(), cmPod("u2")); err != nil {
		t.Fatal(err)
	}
	if ev := drain(events2.Events); len(ev) != 1 || !strings.Contains(ev[0], "FailedMount") {
		t.Fatalf("missing ConfigMap: events %q", ev)
	}
}

// A restarted node resumes the runtime's event log where its previous
// process stopped: no Event is posted twice.
func TestWatchResumesEventLog(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(datadir.New(dir).AgentDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	rt := newFakeRuntime()
	for i := 1; i <= 3; i++ {
		rt.events = append(rt.events, &runtimev1.PodEvent{PodUid: "u1", Seq: uint64(i), Reason: []string{"Pulled", "Created", "Started"}[i-1], Message: "m"})
	}
	start := func() (*record.FakeRecorder, context.CancelFunc, chan struct{}) {
		events := record.NewFakeRecorder(100)
		p := newProvider(rt.client(), podspec.New(podspec.Config{}), "127.0.0.1", events, quiet(), false)
		p.pos = loadEventPos(datadir.New(dir).RuntimeEventsFile(), quiet())
		p.adopt(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u1"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { p.watch(ctx); p.pos.flush(); close(done) }()
		return events, cancel, done
	}
	ev, stop, done := start()
	poll.Until(t, 10*time.Second, "three events", func() bool { return len(ev.Events) == 3 })
	// Killed (no flush at exit) after the position was written: wait for
	// the debounced write.
	poll.Until(t, 10*time.Second, "position written", func() bool {
		data, _ := os.ReadFile(datadir.New(dir).RuntimeEventsFile())
		return strings.Contains(string(data), `"seq":3`)
	})
	stop()
	<-done
	rt.mu.Lock()
	rt.events = append(rt.events, &runtimev1.PodEvent{PodUid: "u1", Seq: 4, Reason: "Killing", Message: "m"})
	rt.mu.Unlock()
	ev2, stop2, done2 := start()
	defer func() { stop2(); <-done2 }()
	poll.Until(t, 10*time.Second, "the new event", func() bool { return len(ev2.Events) >= 1 })
	time.Sleep(200 * time.Millisecond)
	got := drain(ev2.Events)
	if len(got) != 1 || !strings.Contains(got[0], "Killing") {
		t.Fatalf("restarted node posted %q, want only the new Killing", got)
	}
	rt.mu.Lock()
	last := rt.watches[len(rt.watches)-1]
	rt.mu.Unlock()
	if last.EventsBootId != "boot-1" || last.EventsAfterSeq != 3 {
		t.Fatalf("watch resumed from %q/%d", last.EventsBootId, last.EventsAfterSeq)
	}
	// A new daemon boot replays its own events from the start.
	rt.mu.Lock()
	rt.bootID = "boot-2"
	rt.events = []*runtimev1.PodEvent{{PodUid: "u1", Seq: 1, Reason: "PodReattached", Message: "m"}}
	rt.mu.Unlock()
	stop2()
	<-done2
	ev3, stop3, done3 := start()
	defer func() { stop3(); <-done3 }()
	poll.Until(t, 10*time.Second, "the new boot's event", func() bool { return len(ev3.Events) >= 1 })
	if got := drain(ev3.Events); len(got) != 1 || !strings.Contains(got[0], "PodReattached") {
		t.Fatalf("after a daemon restart: %q", got)
	}
}

// A status Virtual Kubelet dropped (after its retries, or because its
// informer did not have the pod yet) is repaired by the reconcile round: the
// API showed a running pod ContainerCreating for good before.
func TestReconcileRepairsLostStatus(t *testing.T) {
	rt := newFakeRuntime()
	p := newProvider(rt.client(), podspec.New(podspec.Config{}), "127.0.0.1", nil, quiet(), false)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u1", ResourceVersion: "10"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	var mu sync.Mutex
	api := pod.DeepCopy()
	api.Status = waitingStatus(pod, "ContainerCreating", "", "", "127.0.0.1")
	var writes []*corev1.Pod
	p.apiPod = func(ns, name string) (*corev1.Pod, bool) {
		mu.Lock()
		defer mu.Unlock()
		return api.DeepCopy(), true
	}
	p.writeStatus = func(_ context.Context, w *corev1.Pod) error {
		mu.Lock()
		defer mu.Unlock()
		if w.ResourceVersion != api.ResourceVersion {
			return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, w.Name, errors.New("rv"))
		}
		writes = append(writes, w.DeepCopy())
		api.Status = w.Status
		api.ResourceVersion = "11"
		return nil
	}
	// Virtual Kubelet lost every notification.
	var notified int
	var nmu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.NotifyPods(ctx, func(*corev1.Pod) { nmu.Lock(); notified++; nmu.Unlock() })
	p.adopt(pod)
	st := running("u1", 2)
	st.ContainerStatuses = []*runtimev1.ContainerStatus{{Name: "c", Ready: true, Started: true,
		State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{}}}}}
	rt.statuses = []*runtimev1.PodStatus{st} // the runtime's view, by ListPods
	p.reconcileRound(ctx)
	poll.Until(t, 5*time.Second, "status notified again", func() bool { nmu.Lock(); defer nmu.Unlock(); return notified >= 1 })
	mu.Lock()
	if len(writes) != 0 {
		t.Fatal("written on the first round, while an update may still be in flight")
	}
	mu.Unlock()
	p.reconcileRound(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(writes) != 1 || writes[0].Status.Phase != corev1.PodRunning || writes[0].Status.ContainerStatuses[0].State.Running == nil {
		t.Fatalf("writes %+v", writes)
	}
	mu.Unlock()
	p.reconcileRound(ctx) // agrees now: nothing to do
	mu.Lock()
	if len(writes) != 1 {
		t.Fatalf("%d writes once the API agrees", len(writes))
	}
}

// Once a deleted pod's terminal status is sent, the node keeps nothing of
// it: its state (with the retry a missing ConfigMap scheduled) and its name
// are gone, and the retry never fires.
func TestDeletedPodLeavesNoState(t *testing.T) {
	rt := newFakeRuntime()
	src := &flakySource{fakeSource: fakeSource{cms: map[string]*corev1.ConfigMap{}}}
	p := newProvider(rt.client(), podspec.New(podspec.Config{Source: src}), "127.0.0.1", nil, quiet(), false)
	p.retryDelay = 100 * time.Millisecond
	rec := &recorder{last: map[string]*corev1.Pod{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.NotifyPods(ctx, rec.notify)
	pod := cmPod("u1")
	if err := p.CreatePod(ctx, pod); err != nil { // FailedMount: a retry is scheduled
		t.Fatal(err)
	}
	p.mu.Lock()
	retry := p.pods["u1"] != nil && p.pods["u1"].retry != nil
	p.mu.Unlock()
	if !retry {
		t.Fatal("no retry scheduled for a pod whose ConfigMap is missing")
	}
	if err := p.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "state forgotten", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.pods) == 0 && len(p.byName) == 0
	})
	src.mu.Lock()
	src.cms["cm"] = &corev1.ConfigMap{Data: map[string]string{"k": "v"}}
	src.mu.Unlock()
	time.Sleep(300 * time.Millisecond)
	if rt.isLive("u1") {
		t.Fatal("a forgotten pod was started")
	}
	if got := rec.get("p"); got == nil || got.Status.Phase != corev1.PodFailed {
		t.Fatalf("terminal status not sent: %+v", got)
	}
}
