package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/tools/reference"
	"k8s.io/utils/ptr"
)

// Provider runs the node's pods through the runtime daemon. It is the
// Virtual Kubelet PodLifecycleHandler and PodNotifier, plus the kubelet API
// callbacks (logs, exec, attach, port-forward, stats).
type Provider struct {
	rt       *client.Client
	tr       *translator
	nodeIP   string
	recorder record.EventRecorder
	log      *slog.Logger
	// instant marks pods Running without starting anything: the floor of
	// the pod-start benchmark, never used for real workloads.
	instant bool

	mu     sync.Mutex
	pods   map[types.UID]*corev1.Pod // last status per pod, by uid
	byName map[string]types.UID      // namespace/name -> uid
	known  map[types.UID]bool        // the runtime has this pod
	// retry is the pending start of a pod that could not start yet; a timer
	// that finds another one (or none) here was cancelled.
	retry map[types.UID]*retryTimer
	// attempts counts a pod's starts that failed transiently (backoff).
	attempts map[types.UID]int
	// deleting are pods DeletePod was called for: they are never (re)created.
	deleting map[types.UID]bool
	// podLocks serializes the runtime calls that create and delete one pod,
	// so a start (a retry, Virtual Kubelet's create) cannot overtake or race
	// DeletePod.
	podLocks keyedMutex
	// retryDelay is the wait before starting again a pod whose config or
	// volumes are not there yet (the kubelet's sync period is alike).
	retryDelay time.Duration
	// remove deletes a terminated pod from the API (grace 0), as the kubelet
	// does once every container is gone.
	remove func(ns, name string, uid types.UID)
	// pending holds runtime events of pods the API has not shown us yet
	// (replayed after a restart); they are recorded once the pod arrives.
	pending map[types.UID][]*runtimev1.PodEvent
	// rev is the newest runtime status revision applied per pod, so a late
	// reply (a CreatePod response racing the watch) cannot roll a status back.
	rev map[types.UID]uint64
	// gone are pods torn down whose terminal status is still to be sent.
	gone map[types.UID]bool
	// dirty carries pods whose status changed to the one goroutine that
	// tells Virtual Kubelet: it always sends the newest status, so
	// notifications can never arrive out of order.
	dirty chan types.UID
	// volHash is the files volumes last sent to the runtime per pod.
	volHash map[types.UID][32]byte
	// apiUID is the uid of the API's pod of that name (the informer's
	// view): Virtual Kubelet looks pods up by name, the node by uid.
	apiUID func(ns, name string) (types.UID, bool)
	// apiPod is the API's pod of that name (the informer's view) and
	// writeStatus updates a pod's status in the API: the reconcile round
	// (reconcile.go) uses them to repair statuses lost on the way.
	apiPod      func(ns, name string) (*corev1.Pod, bool)
	writeStatus func(ctx context.Context, pod *corev1.Pod) error
	// stale are pods whose API status differed from the node's in the last
	// reconcile round.
	stale map[types.UID]staleStatus
	// pos keeps where the runtime's event log was read up to (nil: not kept).
	pos *eventPos
}

func newProvider(rt *client.Client, tr *translator, nodeIP string, recorder record.EventRecorder, log *slog.Logger, instant bool) *Provider {
	return &Provider{rt: rt, tr: tr, nodeIP: nodeIP, recorder: recorder, log: log, instant: instant,
		pods: map[types.UID]*corev1.Pod{}, byName: map[string]types.UID{}, known: map[types.UID]bool{}, retry: map[types.UID]*retryTimer{},
		attempts: map[types.UID]int{}, deleting: map[types.UID]bool{}, stale: map[types.UID]staleStatus{}, retryDelay: 10 * time.Second,
		pending: map[types.UID][]*runtimev1.PodEvent{}, rev: map[types.UID]uint64{}, gone: map[types.UID]bool{},
		dirty: make(chan types.UID, 4096), volHash: map[types.UID][32]byte{}}
}

func key(ns, name string) string { return ns + "/" + name }

// CreatePod hands a pod to the runtime. A pod the runtime already runs (the
// node restarted) is re-adopted, not recreated.
func (p *Provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	unlock := p.podLocks.lock(pod.UID)
	defer unlock()
	return p.create(ctx, pod)
}

// create is CreatePod with the pod's lock held.
func (p *Provider) create(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	deleting := p.deleting[pod.UID] || p.gone[pod.UID]
	p.mu.Unlock()
	if deleting {
		return nil // DeletePod came first: never start it again
	}
	pod, known := p.adopt(pod)
	if p.instant {
		p.publish(pod.UID, instantStatus(pod, p.nodeIP))
		return nil
	}
	spec, err := p.tr.podSpec(ctx, pod)
	var te *transientError
	if errors.As(err, &te) {
		p.apiUnavailable(pod, known, te)
		return nil
	}
	if err != nil && known {
		// The runtime runs this pod already (the node restarted and
		// re-adopts it): it keeps running what it runs, as with UpdatePod.
		p.log.Warn("re-adopted pod: its spec does not translate now; it keeps running as it is", "pod", key(pod.Namespace, pod.Name), "err", err)
		return nil
	}
	var ce *configError
	if errors.As(err, &ce) {
		p.configFailed(pod, ce)
		return nil
	}
	var ve *volumeError
	if errors.As(err, &ve) {
		p.mountFailed(pod, ve)
		return nil
	}
	if err != nil {
		return err
	}
	if known {
		_, err = p.rt.Runtime.UpdatePod(ctx, &runtimev1.UpdatePodRequest{Pod: spec})
	} else {
		// The status comes through the watch only: it is ordered, while a
		// reply can arrive after newer statuses of the same pod.
		_, err = p.rt.Runtime.CreatePod(ctx, &runtimev1.CreatePodRequest{Pod: spec})
		if status.Code(err) == codes.AlreadyExists {
			_, err = p.rt.Runtime.UpdatePod(ctx, &runtimev1.UpdatePodRequest{Pod: spec})
		}
	}
	if err != nil {
		if isTransientRuntimeError(err) {
			p.runtimeUnavailable(pod, known, err)
			return nil
		}
		return fmt.Errorf("runtime: %w", err)
	}
	p.mu.Lock()
	p.known[pod.UID] = true
	delete(p.attempts, pod.UID)
	p.mu.Unlock()
	p.sentVolumes(pod.UID, spec.Volumes)
	return nil
}

// adopt stores the API's view of a pod (keeping the status we last
// reported) and records runtime events that arrived before it did.
func (p *Provider) adopt(pod *corev1.Pod) (*corev1.Pod, bool) {
	pod = pod.DeepCopy()
	p.mu.Lock()
	if old, ok := p.pods[pod.UID]; ok {
		pod.Status = old.Status
	}
	// A pod of the same name with another uid left the API (a name is
	// unique at any time): stop it, as the kubelet does by uid.
	var replaced *corev1.Pod
	if prev, ok := p.byName[key(pod.Namespace, pod.Name)]; ok && prev != pod.UID && !p.gone[prev] && p.isAPIPod(pod) {
		if old, ok := p.pods[prev]; ok {
			replaced = old.DeepCopy()
		}
	}
	p.pods[pod.UID] = pod
	p.byName[key(pod.Namespace, pod.Name)] = pod.UID
	known := p.known[pod.UID]
	pending := p.pending[pod.UID]
	delete(p.pending, pod.UID)
	p.mu.Unlock()
	for _, e := range pending {
		p.runtimeEvent(pod, e)
	}
	if replaced != nil {
		if replaced.DeletionTimestamp == nil {
			now := metav1.Now()
			replaced.DeletionTimestamp = &now
		}
		if replaced.DeletionGracePeriodSeconds == nil {
			replaced.DeletionGracePeriodSeconds = ptr.To[int64](0)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := p.DeletePod(ctx, replaced); err != nil {
			p.log.Warn("stopping a pod replaced by one of the same name", "pod", key(pod.Namespace, pod.Name), "uid", replaced.UID, "err", err)
		}
		cancel()
	}
	if known {
		// Re-adopted after a restart: report what the runtime last said.
		p.dirty <- pod.UID
	}
	return pod, known
}

// apiUnavailable: the API did not answer while the pod's spec was being
// resolved. A pod the runtime runs keeps its status and gets no event; one
// not started yet is retried with backoff, with a warning like the kubelet's
// on its first failure.
func (p *Provider) apiUnavailable(pod *corev1.Pod, known bool, te *transientError) {
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
	cur, ok := p.pods[pod.UID]
	fresh := ok && len(cur.Status.ContainerStatuses) == 0
	p.mu.Unlock()
	if fresh {
		p.publish(pod.UID, waitingStatus(pod, "ContainerCreating", "", "", p.nodeIP))
	}
	return fresh
}

// backoff is the delay before a pod's next start after a transient failure:
// 1 s, doubling up to 30 s.
func (p *Provider) backoff(uid types.UID) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.attempts[uid]
	p.attempts[uid] = n + 1
	return min(time.Second<<min(n, 5), 30*time.Second)
}

// isAPIPod: the API's pod of pod's name is pod (or the node cannot tell).
// A late start of a pod the API replaced must not stop its successor.
func (p *Provider) isAPIPod(pod *corev1.Pod) bool {
	if p.apiUID == nil {
		return true
	}
	uid, found := p.apiUID(pod.Namespace, pod.Name)
	return !found || uid == pod.UID
}

// configFailed reports CreateContainerConfigError and retries, as the kubelet
// does when a referenced ConfigMap or Secret is missing.
func (p *Provider) configFailed(pod *corev1.Pod, ce *configError) {
	p.publish(pod.UID, waitingStatus(pod, "CreateContainerConfigError", ce.Error(), ce.container, p.nodeIP))
	p.event(pod, ce.container, corev1.EventTypeWarning, "Failed", "Error: "+ce.Error())
	p.retryLater(pod.UID, p.retryDelay)
}

// mountFailed is a volume that cannot be set up yet: the pod stays
// ContainerCreating with a FailedMount event, and the node retries.
func (p *Provider) mountFailed(pod *corev1.Pod, ve *volumeError) {
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
	if p.deleting[uid] || p.gone[uid] {
		return
	}
	if old := p.retry[uid]; old != nil {
		old.t.Stop()
	}
	rt := &retryTimer{}
	p.retry[uid] = rt
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
	if p.retry[uid] != rt {
		p.mu.Unlock()
		return
	}
	delete(p.retry, uid)
	cur, ok := p.pods[uid]
	if !ok || p.deleting[uid] || p.gone[uid] || cur.DeletionTimestamp != nil || cur.Spec.Containers == nil {
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

// UpdatePod passes spec changes (e.g. a new image) to the runtime.
func (p *Provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	pod, known := p.adopt(pod)
	if p.instant || !known {
		return nil
	}
	spec, err := p.tr.podSpec(ctx, pod)
	if err != nil {
		return nil // keep running what runs; the kubelet does not stop a pod for this
	}
	if _, err = p.rt.Runtime.UpdatePod(ctx, &runtimev1.UpdatePodRequest{Pod: spec}); err != nil {
		return err
	}
	// Labels and annotations show in downwardAPI volumes at once: the spec
	// just resolved carries them.
	p.sendVolumes(ctx, pod, spec.Volumes)
	return nil
}

// DeletePod starts a graceful stop; the terminal status follows through the
// runtime's watch once the pod is torn down.
func (p *Provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	p.deleting[pod.UID] = true
	if rt := p.retry[pod.UID]; rt != nil {
		rt.t.Stop()
		delete(p.retry, pod.UID)
	}
	p.mu.Unlock()
	// A start under way finishes first: then the pod is known and is
	// deleted in the runtime too.
	unlock := p.podLocks.lock(pod.UID)
	defer unlock()
	p.mu.Lock()
	if cur, ok := p.pods[pod.UID]; ok {
		cur.DeletionTimestamp = pod.DeletionTimestamp
		cur.DeletionGracePeriodSeconds = pod.DeletionGracePeriodSeconds
	}
	known := p.known[pod.UID]
	p.mu.Unlock()
	p.tr.tokens.forget(pod.UID)
	if p.instant || !known {
		p.finished(pod.UID)
		return nil
	}
	req := &runtimev1.DeletePodRequest{Uid: string(pod.UID)}
	if pod.DeletionGracePeriodSeconds != nil {
		g := *pod.DeletionGracePeriodSeconds
		req.GracePeriodSeconds = &g
	}
	if _, err := p.rt.Runtime.DeletePod(ctx, req); err != nil {
		if status.Code(err) == codes.NotFound {
			p.finished(pod.UID)
			return nil
		}
		return err
	}
	return nil
}

// finished marks a deleted pod terminal; the notifier sends that status so
// Virtual Kubelet removes it from the API, then forgets the pod.
func (p *Provider) finished(uid types.UID) {
	p.mu.Lock()
	pod, ok := p.pods[uid]
	if ok {
		terminate := func(list []corev1.ContainerStatus) {
			for i := range list {
				if list[i].State.Terminated == nil {
					list[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
						ExitCode: 137, Reason: "Error", Message: "pod deleted", FinishedAt: metav1.Now()}}
				}
				list[i].Ready = false
			}
		}
		terminate(pod.Status.InitContainerStatuses)
		terminate(pod.Status.ContainerStatuses)
		terminate(pod.Status.EphemeralContainerStatuses)
		if pod.Status.Phase != corev1.PodSucceeded {
			pod.Status.Phase = corev1.PodFailed
		}
		p.gone[uid] = true
	}
	p.mu.Unlock()
	if ok {
		p.dirty <- uid
	}
}

// notifier sends pods' newest statuses to Virtual Kubelet, one at a time.
func (p *Provider) notifier(ctx context.Context, notify func(*corev1.Pod)) {
	for {
		var uid types.UID
		select {
		case <-ctx.Done():
			return
		case uid = <-p.dirty:
		}
		p.mu.Lock()
		pod, ok := p.pods[uid]
		final := p.gone[uid]
		if ok {
			pod = pod.DeepCopy()
		}
		if ok && final {
			delete(p.pods, uid)
			delete(p.known, uid)
			delete(p.pending, uid)
			delete(p.rev, uid)
			delete(p.gone, uid)
			delete(p.volHash, uid)
			delete(p.attempts, uid)
			delete(p.deleting, uid)
			delete(p.stale, uid)
			if rt := p.retry[uid]; rt != nil {
				rt.t.Stop()
				delete(p.retry, uid)
			}
			if p.byName[key(pod.Namespace, pod.Name)] == uid {
				delete(p.byName, key(pod.Namespace, pod.Name))
			}
		}
		p.mu.Unlock()
		if !ok || pod.Spec.Containers == nil {
			continue // forgotten, or a stub the API has not shown us yet
		}
		notify(pod)
		if final && pod.DeletionTimestamp != nil && p.remove != nil {
			go p.remove(pod.Namespace, pod.Name, pod.UID)
		}
	}
}

// GetPod returns the pod with its last known status.
func (p *Provider) GetPod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	uid := p.byName[key(ns, name)]
	if pod, ok := p.pods[uid]; ok {
		if p.apiUID != nil {
			if cur, found := p.apiUID(ns, name); found && cur != uid {
				// The API has a new pod of this name: this one is not it.
				return nil, errdefs.NotFoundf("pod %s/%s (uid %s) is not known to this node", ns, name, cur)
			}
		}
		return pod.DeepCopy(), nil
	}
	return nil, errdefs.NotFoundf("pod %s/%s is not known to this node", ns, name)
}

// GetPodStatus returns the pod's last known status.
func (p *Provider) GetPodStatus(ctx context.Context, ns, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods lists every pod the node runs, including pods the runtime still
// has from before a restart (Virtual Kubelet deletes those gone from the API).
func (p *Provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		out = append(out, pod.DeepCopy())
	}
	return out, nil
}

// NotifyPods registers Virtual Kubelet's status callback.
func (p *Provider) NotifyPods(ctx context.Context, cb func(*corev1.Pod)) {
	go p.notifier(ctx, cb)
}

// publish records st for the pod and queues it for Virtual Kubelet.
func (p *Provider) publish(uid types.UID, st corev1.PodStatus) {
	p.mu.Lock()
	pod, ok := p.pods[uid]
	if ok && !p.gone[uid] {
		pod.Status = st
	}
	p.mu.Unlock()
	if ok {
		p.dirty <- uid
	}
}

// update applies a runtime status to the pod it belongs to.
func (p *Provider) update(rs *runtimev1.PodStatus) {
	uid := types.UID(rs.Uid)
	p.mu.Lock()
	if rs.Revision < p.rev[uid] {
		p.mu.Unlock()
		return // older than what was applied already
	}
	p.rev[uid] = rs.Revision
	pod, ok := p.pods[uid]
	if !ok {
		// A pod the runtime runs but the API has not shown us (yet): keep a
		// stub so GetPods reports it and Virtual Kubelet can reconcile.
		pod = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid, Namespace: rs.Namespace, Name: rs.Name}}
		p.pods[uid] = pod
		p.byName[key(rs.Namespace, rs.Name)] = uid
	}
	p.known[uid] = true
	if !p.gone[uid] {
		pod.Status = podStatus(pod, rs, p.nodeIP)
	}
	p.mu.Unlock()
	p.dirty <- uid
}

func (p *Provider) event(pod *corev1.Pod, container, typ, reason, msg string) {
	if p.recorder == nil {
		return
	}
	ref, err := reference.GetReference(scheme.Scheme, pod)
	if err != nil {
		return
	}
	if container != "" {
		ref.FieldPath = containerFieldPath(pod, container)
	}
	p.recorder.Event(ref, typ, reason, msg)
}

func containerFieldPath(pod *corev1.Pod, name string) string {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return "spec.initContainers{" + name + "}"
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if c.Name == name {
			return "spec.ephemeralContainers{" + name + "}"
		}
	}
	return "spec.containers{" + name + "}"
}

// watch follows the runtime's status stream for the life of ctx, reconnecting
// (and resuming events) when the daemon restarts. With p.pos it resumes from
// where the node's previous process stopped reading, so a restarted node does
// not post the runtime's buffered events again.
func (p *Provider) watch(ctx context.Context) {
	var bootID string
	var seq uint64
	if p.pos != nil {
		pos := p.pos.get()
		bootID, seq = pos.BootID, pos.Seq
		go p.pos.run(ctx)
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		stream, err := p.rt.Runtime.WatchPodStatus(ctx, &runtimev1.WatchPodStatusRequest{EventsBootId: bootID, EventsAfterSeq: seq})
		if err == nil {
			for {
				msg, err := stream.Recv()
				if err != nil {
					break
				}
				delay = 100 * time.Millisecond
				if msg.BootId != "" && msg.BootId != bootID {
					bootID, seq = msg.BootId, 0
					if p.pos != nil {
						p.pos.set(watchPos{BootID: bootID, Seq: seq})
					}
					// Revisions count again from zero in a new daemon.
					p.mu.Lock()
					clear(p.rev)
					p.mu.Unlock()
				}
				switch msg.Kind {
				case runtimev1.WatchPodStatusResponse_KIND_INITIAL, runtimev1.WatchPodStatusResponse_KIND_UPDATED:
					if msg.Status != nil {
						p.update(msg.Status)
					}
				case runtimev1.WatchPodStatusResponse_KIND_DELETED:
					if msg.Status != nil {
						p.update(msg.Status)
						p.finished(types.UID(msg.Status.Uid))
					}
				case runtimev1.WatchPodStatusResponse_KIND_EVENT:
					if e := msg.Event; e != nil {
						seq = e.Seq
						if p.pos != nil {
							p.pos.set(watchPos{BootID: bootID, Seq: seq})
						}
						uid := types.UID(e.PodUid)
						p.mu.Lock()
						pod := p.pods[uid]
						if pod == nil || pod.Spec.Containers == nil {
							if len(p.pending[uid]) < 64 {
								p.pending[uid] = append(p.pending[uid], e)
							}
							pod = nil
						}
						p.mu.Unlock()
						if pod != nil {
							p.runtimeEvent(pod, e)
						}
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}

func (p *Provider) runtimeEvent(pod *corev1.Pod, e *runtimev1.PodEvent) {
	typ := corev1.EventTypeNormal
	if e.Type == runtimev1.EventType_EVENT_TYPE_WARNING {
		typ = corev1.EventTypeWarning
	}
	p.event(pod, e.Container, typ, e.Reason, e.Message)
}

func instantStatus(pod *corev1.Pod, nodeIP string) corev1.PodStatus {
	now := timestampNow()
	rs := &runtimev1.PodStatus{Phase: runtimev1.PodPhase_POD_PHASE_RUNNING, Initialized: true, ContainersReady: true, StartTime: now}
	for _, c := range pod.Spec.Containers {
		rs.ContainerStatuses = append(rs.ContainerStatuses, &runtimev1.ContainerStatus{Name: c.Name, Image: c.Image, Ready: true, Started: true,
			State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{StartedAt: now}}}})
	}
	return podStatus(pod, rs, nodeIP)
}
