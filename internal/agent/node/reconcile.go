package node

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// ReconcilePeriod is how often the node compares what the API shows of its
// pods with what the runtime reports and re-sends what differs.
//
// Status reporting is edge-triggered: a change goes once through the
// notifier to Virtual Kubelet, which drops a status equal to the last one it
// received and forgets a pod after its retries (or after 3 s when its
// informer does not have the pod yet, e.g. while the API is down). A lost
// update would stay lost until the pod changes again; this level-triggered
// round bounds how long the API can be wrong.
const ReconcilePeriod = 5 * time.Second

// staleStatus is a pod whose status in the API differed from the node's in
// the last round.
type staleStatus struct {
	ours, apiRV string
}

// reconcileStatuses runs reconcileRound every period until ctx ends.
func (p *Provider) reconcileStatuses(ctx context.Context, period time.Duration) {
	wait.UntilWithContext(ctx, p.reconcileRound, period)
}

// reconcileRound first takes the runtime's current statuses (ListPods; the
// watch is ordered, so only statuses newer than applied count), then
// compares each pod's status in the API (the informer's cache, no request)
// with the node's. A difference seen for the first time is notified again;
// one that is still there a round later with neither side having moved
// meanwhile (so no update is in flight) is written to the API directly, as
// Virtual Kubelet would.
func (p *Provider) reconcileRound(ctx context.Context) {
	if !p.instant && p.rt != nil {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		list, err := p.rt.Runtime.ListPods(lctx, &runtimev1.ListPodsRequest{})
		cancel()
		if err == nil {
			for _, st := range list.Pods {
				p.mu.Lock()
				var applied uint64
				if ps := p.pods[types.UID(st.Uid)]; ps != nil {
					applied = ps.rev
				}
				newer := st.Revision > applied
				p.mu.Unlock()
				if newer {
					p.update(st)
				}
			}
		}
	}
	if p.apiPod == nil {
		return
	}
	p.mu.Lock()
	var pods []*corev1.Pod
	for _, st := range p.pods {
		if pod := st.pod; pod != nil && !st.gone && pod.Spec.Containers != nil && pod.Status.Phase != "" {
			pods = append(pods, pod.DeepCopy())
		}
	}
	p.mu.Unlock()
	for _, pod := range pods {
		if ctx.Err() != nil {
			return
		}
		api, ok := p.apiPod(pod.Namespace, pod.Name)
		if !ok || api.UID != pod.UID || api.Status.Phase == corev1.PodSucceeded || api.Status.Phase == corev1.PodFailed {
			// Not (or no longer) this pod; a finished pod's status is final
			// in the API (Virtual Kubelet does not update it either).
			p.notStale(pod.UID)
			continue
		}
		ours := statusSummary(pod.Status)
		if statusSummary(api.Status) == ours {
			p.notStale(pod.UID)
			continue
		}
		now := staleStatus{ours: ours, apiRV: api.ResourceVersion}
		p.mu.Lock()
		st := p.state(pod.UID)
		before, seen := st.stale, st.stale != nil
		st.stale = &now
		cur := st.pod
		unchanged := cur != nil && statusSummary(cur.Status) == ours
		p.mu.Unlock()
		if !unchanged {
			continue // moved meanwhile: the notifier has the news
		}
		if !seen || *before != now || p.writeStatus == nil {
			p.log.Info("pod status in the API differs from the runtime's; sending it again", "pod", key(pod.Namespace, pod.Name),
				"api", statusSummary(api.Status), "runtime", ours)
			p.dirty <- pod.UID
			continue
		}
		up := api.DeepCopy()
		up.Status = pod.Status
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := p.writeStatus(wctx, up)
		cancel()
		if err != nil {
			p.log.Warn("writing pod status", "pod", key(pod.Namespace, pod.Name), "err", err)
			continue
		}
		p.log.Info("pod status in the API was still stale; written", "pod", key(pod.Namespace, pod.Name), "status", ours)
		p.notStale(pod.UID)
	}
}

// notStale: the pod's status in the API agrees with the node's (or is not
// the node's to repair).
func (p *Provider) notStale(uid types.UID) {
	p.mu.Lock()
	if st := p.pods[uid]; st != nil {
		st.stale = nil
	}
	p.mu.Unlock()
}

// statusSummary is what of a status must agree between the API and the
// node: phase, reason, each container's state, readiness and restarts, and
// the pod's Ready condition (not times: the API keeps them to the second).
func statusSummary(st corev1.PodStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s", st.Phase, st.Reason)
	for _, c := range st.Conditions {
		if c.Type == corev1.PodReady {
			fmt.Fprintf(&b, " ready=%s", c.Status)
		}
	}
	list := func(kind string, cs []corev1.ContainerStatus) {
		for _, c := range cs {
			fmt.Fprintf(&b, " %s:%s[", kind, c.Name)
			switch s := c.State; {
			case s.Running != nil:
				b.WriteString("running")
			case s.Terminated != nil:
				fmt.Fprintf(&b, "terminated:%d:%s", s.Terminated.ExitCode, s.Terminated.Reason)
			case s.Waiting != nil:
				fmt.Fprintf(&b, "waiting:%s", s.Waiting.Reason)
			}
			fmt.Fprintf(&b, " ready=%t restarts=%d", c.Ready, c.RestartCount)
			if c.Started != nil {
				fmt.Fprintf(&b, " started=%t", *c.Started)
			}
			b.WriteString("]")
		}
	}
	list("init", st.InitContainerStatuses)
	list("c", st.ContainerStatuses)
	return b.String()
}

// keyedMutex is one mutex per pod, made on demand and dropped when unused.
type keyedMutex struct {
	mu sync.Mutex
	m  map[types.UID]*keyedEntry
}

type keyedEntry struct {
	sync.Mutex
	n int
}

// lock locks uid's mutex and returns its unlock.
func (k *keyedMutex) lock(uid types.UID) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[types.UID]*keyedEntry{}
	}
	e := k.m[uid]
	if e == nil {
		e = &keyedEntry{}
		k.m[uid] = e
	}
	e.n++
	k.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		k.mu.Lock()
		if e.n--; e.n == 0 {
			delete(k.m, uid)
		}
		k.mu.Unlock()
	}
}
