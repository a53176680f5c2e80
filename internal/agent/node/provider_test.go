package node

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

type recorder struct {
	mu   sync.Mutex
	last map[string]*corev1.Pod
	n    int
}

func (r *recorder) notify(p *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[p.Name] = p
	r.n++
}

func (r *recorder) get(name string) *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[name]
}

func running(uid string, rev uint64) *runtimev1.PodStatus {
	return &runtimev1.PodStatus{Uid: uid, Namespace: "default", Name: "p", Revision: rev, Phase: runtimev1.PodPhase_POD_PHASE_RUNNING,
		Initialized: true, ContainersReady: true}
}

// A stale status (lower revision) arriving after a newer one must not roll
// the pod back: that is how a CreatePod reply racing the watch used to leave
// pods Pending forever.
func TestStatusNeverGoesBack(t *testing.T) {
	p := newProvider(nil, podspec.New(podspec.Config{}), "127.0.0.1", nil, nil, false)
	rec := &recorder{last: map[string]*corev1.Pod{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.NotifyPods(ctx, rec.notify)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	p.adopt(pod)
	p.update(running("u1", 5))
	pending := running("u1", 2)
	pending.Phase, pending.ContainersReady = runtimev1.PodPhase_POD_PHASE_PENDING, false
	p.update(pending)
	poll.UntilNil(t, 5*time.Second, "the Running status notified", func() error {
		if got := rec.get("p"); got == nil || got.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("last notified status %+v", got)
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond)
	if got := rec.get("p"); got.Status.Phase != corev1.PodRunning {
		t.Fatalf("status went back to %s", got.Status.Phase)
	}
	// A deleted pod is reported terminal once, then forgotten.
	p.finished("u1")
	poll.Until(t, 5*time.Second, "the terminal status sent", func() bool { return rec.get("p").Status.Phase == corev1.PodFailed })
	if _, err := p.GetPod(ctx, "default", "p"); err == nil {
		t.Fatal("pod still known after its terminal status was sent")
	}
}

func TestPodStatusConditions(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	st := podStatus(pod, running("u", 1), "10.0.0.1", false)
	want := map[corev1.PodConditionType]corev1.ConditionStatus{
		corev1.PodInitialized: corev1.ConditionTrue, corev1.ContainersReady: corev1.ConditionTrue,
		corev1.PodReady: corev1.ConditionTrue, corev1.PodScheduled: corev1.ConditionTrue,
	}
	for _, c := range st.Conditions {
		if w, ok := want[c.Type]; ok && c.Status != w {
			t.Fatalf("%s = %s", c.Type, c.Status)
		}
	}
	if st.PodIP != "10.0.0.1" || st.HostIP != "10.0.0.1" {
		t.Fatalf("ips %s %s", st.PodIP, st.HostIP)
	}
	// Transition times are kept while a condition does not change.
	pod.Status = st
	again := podStatus(pod, running("u", 2), "10.0.0.1", false)
	if !again.Conditions[3].LastTransitionTime.Equal(&st.Conditions[3].LastTransitionTime) {
		t.Fatal("Ready's transition time moved without a transition")
	}
}

// A container being created shows no ids, as the kubelet's does: the
// runtime's record of the attempt before its start leaves the API status as
// it was, so Virtual Kubelet writes nothing for it.
func TestCreatingContainerHasNoIDs(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	waiting := func(id, image string) *runtimev1.PodStatus {
		return &runtimev1.PodStatus{Uid: "u", Phase: runtimev1.PodPhase_POD_PHASE_PENDING, Revision: 1,
			ContainerStatuses: []*runtimev1.ContainerStatus{{Name: "c", Image: "prog:1", ImageId: image, ContainerId: id,
				State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Waiting{Waiting: &runtimev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}}}
	}
	admitted := podStatus(pod, waiting("", ""), "10.0.0.1", false)
	pod.Status = admitted // as the provider keeps it
	recorded := podStatus(pod, waiting("k3sm://ab", "prog@sha256:cd"), "10.0.0.1", false)
	if !apiequality.Semantic.DeepEqual(admitted, recorded) {
		t.Fatalf("the attempt's record changed the API status:\n%+v\n%+v", admitted.ContainerStatuses, recorded.ContainerStatuses)
	}
	rs := running("u", 2)
	rs.ContainerStatuses = []*runtimev1.ContainerStatus{{Name: "c", Image: "prog:1", ImageId: "prog@sha256:cd", ContainerId: "k3sm://ab",
		State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{StartedAt: timestamppb.Now()}}}}}
	if cs := podStatus(pod, rs, "10.0.0.1", false).ContainerStatuses[0]; cs.ContainerID != "k3sm://ab" || cs.ImageID != "prog@sha256:cd" {
		t.Fatalf("running container without its ids: %+v", cs)
	}
}

// Virtual Kubelet looks pods up by name: a pod that reuses a deleted pod's
// name must not be answered with the old one, or it is never started.
func TestGetPodAnswersForTheAPIsUID(t *testing.T) {
	p := newProvider(nil, podspec.New(podspec.Config{}), "192.0.2.1", nil, slog.New(slog.DiscardHandler), false)
	api := map[string]types.UID{}
	p.apiUID = func(ns, name string) (types.UID, bool) { uid, ok := api[name]; return uid, ok }
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p", UID: "old"}}
	p.adopt(old)
	api["p"] = "old"
	if got, err := p.GetPod(context.Background(), "default", "p"); err != nil || got.UID != "old" {
		t.Fatalf("same uid: %v %v", got, err)
	}
	api["p"] = "new"
	if got, err := p.GetPod(context.Background(), "default", "p"); err == nil || got != nil {
		t.Fatalf("a new pod of the same name was answered with the old one: %v", got)
	}
	delete(api, "p") // gone from the API: Virtual Kubelet deletes it through GetPod
	if got, err := p.GetPod(context.Background(), "default", "p"); err != nil || got.UID != "old" {
		t.Fatalf("pod gone from the API: %v %v", got, err)
	}
}
