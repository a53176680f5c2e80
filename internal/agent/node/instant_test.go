package node

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// tokenSource is fakeSource that issues tokens and counts the requests.
type tokenSource struct {
	fakeSource
	mu     sync.Mutex
	tokens int
}

func (s *tokenSource) Token(_ context.Context, _, _ string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	s.mu.Lock()
	s.tokens++
	s.mu.Unlock()
	out := req.DeepCopy()
	out.Status = authenticationv1.TokenRequestStatus{Token: "t", ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Hour))}
	return out, nil
}

// The fair floor writes what a real start writes, in its order, and starts
// nothing (the provider has no runtime): the service account token is
// requested, the Pending status with ContainerCreating is published, then
// Pulled, Created and Started per container, then Running once Pending is
// in the API (so that both are written, as in a real start). The plain
// instant floor writes only Running.
func TestInstantWithWrites(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u1"},
		Spec: corev1.PodSpec{ServiceAccountName: "default", Containers: []corev1.Container{{Name: "c", Image: "reg/app:1"}},
			Volumes: []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To(int64(3607))}}}}}}}}}
	for _, writes := range []bool{true, false} {
		src := &tokenSource{}
		events := record.NewFakeRecorder(100)
		p := newProvider(nil, podspec.New(podspec.Config{Source: src}), "127.0.0.1", events, quiet(), true)
		p.instantWrites = writes
		var mu sync.Mutex
		var phases []string
		// Virtual Kubelet as the node meets it: notify queues the pod and
		// one worker writes the newest status it has (20 ms a write), so
		// statuses notified back to back are written once; the node's
		// informer then shows what was written.
		var written corev1.PodStatus
		p.apiPod = func(ns, name string) (*corev1.Pod, bool) {
			mu.Lock()
			defer mu.Unlock()
			cur := pod.DeepCopy()
			cur.Status = written
			return cur, true
		}
		ctx, cancel := context.WithCancel(context.Background())
		var latest *corev1.Pod
		queued := make(chan struct{}, 1)
		p.NotifyPods(ctx, func(got *corev1.Pod) {
			mu.Lock()
			latest = got
			mu.Unlock()
			select {
			case queued <- struct{}{}:
			default:
			}
		})
		go func() {
			last := ""
			for {
				select {
				case <-ctx.Done():
					return
				case <-queued:
				}
				time.Sleep(20 * time.Millisecond)
				mu.Lock()
				ph := string(latest.Status.Phase)
				if cs := latest.Status.ContainerStatuses; len(cs) == 1 && cs[0].State.Waiting != nil {
					ph += "/" + cs[0].State.Waiting.Reason
				}
				if ph != last {
					written, last = latest.Status, ph
					phases = append(phases, ph)
				}
				mu.Unlock()
			}
		}()
		if err := p.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 5*time.Second, "Running notified", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(phases) > 0 && phases[len(phases)-1] == "Running"
		})
		cancel()
		var got []string
		for len(events.Events) > 0 {
			got = append(got, <-events.Events)
		}
		if !writes {
			if src.tokens != 0 || len(got) != 0 {
				t.Errorf("instant floor: %d tokens, events %q", src.tokens, got)
			}
			continue
		}
		if src.tokens != 1 {
			t.Errorf("fair floor: %d token requests, want 1", src.tokens)
		}
		want := []string{`Normal Pulled Container image "reg/app:1" already present on machine`, "Normal Created Created container c", "Normal Started Started container c"}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("fair floor events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		// Both statuses are written, Pending first: Running waits for it
		// to be in the API.
		mu.Lock()
		if strings.Join(phases, " ") != "Pending/ContainerCreating Running" {
			t.Errorf("statuses written: %q", phases)
		}
		mu.Unlock()
	}
}
