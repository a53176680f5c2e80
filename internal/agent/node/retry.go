package node

// Retrying pod starts that failed for a while: the policy for each of
// the four kinds (the API did not answer, the runtime did not take the
// pod, a ConfigMap or Secret is missing, a volume is not ready), the
// back-off between attempts, and the timers that start a pod again.

import (
	"context"
	"time"

	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	"github.com/k3sm-dev/k3sm/internal/backoff"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// apiUnavailable: the API did not answer while the pod's spec was being
// resolved. A pod the runtime runs keeps its status and gets no event; one
// not started yet is retried with backoff, with a warning like the kubelet's
// on its first failure.
func (p *Provider) apiUnavailable(pod *corev1.Pod, known bool, te *podspec.TransientError) {
	if known {
		p.log.Warn("re-adopted pod: the API did not answer; retrying", "pod", key(pod.Namespace, pod.Name), "err", te)
		p.retryLater(pod.UID, p.backoff(pod.UID))
		return
	}
	if p.startsWaiting(pod) {
		p.event(pod, "", corev1.EventTypeWarning, "FailedSync", "Error syncing pod, will retry: "+te.Error())
	}
	p.retryLater(pod.UID, p.backoff(pod.UID))
}

// runtimeUnavailable: the runtime daemon did not take the pod (it is
// restarting); start it again with backoff. The call is repeated as it was:
// a pod the daemon did create answers AlreadyExists and is updated.
func (p *Provider) runtimeUnavailable(pod *corev1.Pod, known bool, err error) {
	p.log.Warn("runtime did not take the pod; retrying", "pod", key(pod.Namespace, pod.Name), "err", err)
	if !known {
		p.startsWaiting(pod)
	}
	p.retryLater(pod.UID, p.backoff(pod.UID))
}

// startsWaiting reports a pod without any status yet as ContainerCreating
// (it is: nothing has started) and says whether it did.
func (p *Provider) startsWaiting(pod *corev1.Pod) bool {
	p.mu.Lock()
	cur := p.podOf(pod.UID)
	fresh := cur != nil && len(cur.Status.ContainerStatuses) == 0
	p.mu.Unlock()
	if fresh {
		p.publish(pod.UID, waitingStatus(pod, "ContainerCreating", "", "", p.nodeIP))
	}
	return fresh
}

// backoff is the delay before a pod's next start after a transient failure:
// 1 s, doubling up to 30 s (startRetry), from 1 s again once a start
// succeeded.
func (p *Provider) backoff(uid types.UID) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state(uid).starts.Next()
}

// startRetry is the back-off between a pod's starts that failed
// transiently: each pod's podState steps a copy of its own.
var startRetry = backoff.Backoff{Initial: time.Second, Max: 30 * time.Second}

// configFailed reports CreateContainerConfigError and retries, as the kubelet
// does when a referenced ConfigMap or Secret is missing.
func (p *Provider) configFailed(pod *corev1.Pod, ce *podspec.ConfigError) {
	p.publish(pod.UID, waitingStatus(pod, "CreateContainerConfigError", ce.Error(), ce.Container, p.nodeIP))
	p.event(pod, ce.Container, corev1.EventTypeWarning, "Failed", "Error: "+ce.Error())
	p.retryLater(pod.UID, p.retryDelay)
}

// mountFailed is a volume that cannot be set up yet: the pod stays
// ContainerCreating with a FailedMount event, and the node retries.
func (p *Provider) mountFailed(pod *corev1.Pod, ve *podspec.VolumeError) {
	p.publish(pod.UID, waitingStatus(pod, "ContainerCreating", "", "", p.nodeIP))
	p.event(pod, "", corev1.EventTypeWarning, "FailedMount", ve.Error())
	p.retryLater(pod.UID, p.retryDelay)
}

// retryTimer is one scheduled start of a pod.
type retryTimer struct{ t *time.Timer }

// retryLater tries to start the pod again after delay, unless it is deleted
// meanwhile.
func (p *Provider) retryLater(uid types.UID, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.pods[uid]; st != nil && (st.deleting || st.gone) {
		return
	}
	st := p.state(uid)
	if old := st.retry; old != nil {
		old.t.Stop()
	}
	rt := &retryTimer{}
	st.retry = rt
	rt.t = time.AfterFunc(delay, func() { p.retryStart(uid, rt) })
}

// retryStart is a retry timer firing: with the pod's lock held (DeletePod
// waits for it, or it sees what DeletePod did) it starts a copy of the pod
// as the node has it now, unless the retry was cancelled or the pod is
// deleted, forgotten or replaced in the API.
func (p *Provider) retryStart(uid types.UID, rt *retryTimer) {
	unlock := p.podLocks.lock(uid)
	defer unlock()
	p.mu.Lock()
	st := p.pods[uid]
	if st == nil || st.retry != rt {
		p.mu.Unlock()
		return
	}
	st.retry = nil
	cur := st.pod
	if cur == nil || st.deleting || st.gone || cur.DeletionTimestamp != nil || cur.Spec.Containers == nil {
		p.mu.Unlock()
		return
	}
	pod := cur.DeepCopy()
	p.mu.Unlock()
	if p.apiUID != nil {
		if api, found := p.apiUID(pod.Namespace, pod.Name); !found || api != uid {
			return // gone from the API: Virtual Kubelet deletes it
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.create(ctx, pod); err != nil {
		p.log.Warn("retrying pod start", "pod", key(pod.Namespace, pod.Name), "err", err)
	}
}
