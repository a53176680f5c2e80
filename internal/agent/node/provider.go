package node

// The Provider: the node's pods as Virtual Kubelet sees them (create,
// update, delete, statuses and their notifier) and the runtime's status
// watch. Starts that fail for a while are retried by retry.go; instant.go
// is the benchmark-only instant mode.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
	"github.com/k3sm-dev/k3sm/internal/backoff"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"github.com/k3sm-dev/k3sm/internal/runtime/pressure"
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
	// hostPorts is the Service proxy's SetHostPorts, once it runs; with mu.
	hostPorts  func(pod string, ports []proxy.HostPort)
	rt         *client.Client
	translator *podspec.Translator
	nodeName   string
	nodeIP     string
	podNetwork bool // the runtime gives pods their own addresses
	recorder   record.EventRecorder
	log        *slog.Logger
	// instant marks pods Running without starting anything: the floor of
	// the pod-start benchmark, never used for real workloads.
	instant bool
	// instantWrites (with instant) is the fair floor: a real start's API
	// writes, nothing started (instant.go).
	instantWrites bool

	mu sync.Mutex
	// pods is everything the node knows of each pod, by uid: see podState.
	// An entry is made by state and removed by forget, nowhere else.
	pods   map[types.UID]*podState
	byName map[string]types.UID // namespace/name -> uid
	// podLocks serializes the runtime calls that create and delete one pod,
	// so a start (a retry, Virtual Kubelet's create) cannot overtake or race
	// DeletePod. It is apart from pods: a lock outlives the state it guards
	// (DeletePod takes it for a pod the node never saw, and holds it while
	// the notifier forgets the pod).
	podLocks keyedMutex
	// retryDelay is the wait before starting again a pod whose config or
	// volumes are not there yet (the kubelet's sync period is alike).
	retryDelay time.Duration
	// remove deletes a terminated pod from the API (grace 0), as the kubelet
	// does once every container is gone.
	remove func(ns, name string, uid types.UID)
	// dirty carries pods whose status changed to the one goroutine that
	// tells Virtual Kubelet: it always sends the newest status, so
	// notifications can never arrive out of order.
	dirty chan types.UID
	// apiUID is the uid of the API's pod of that name (the informer's
	// view): Virtual Kubelet looks pods up by name, the node by uid.
	apiUID func(ns, name string) (types.UID, bool)
	// apiPod is the API's pod of that name (the informer's view) and
	// writeStatus updates a pod's status in the API: the reconcile round
	// (reconcile.go) uses them to repair statuses lost on the way.
	apiPod      func(ns, name string) (*corev1.Pod, bool)
	writeStatus func(ctx context.Context, pod *corev1.Pod) error
	// memoryEvicted learns that the runtime evicted a pod for memory
	// (MemoryPressure goes True as the kubelet's does when it evicts).
	memoryEvicted func(pod, message string)
	// pos keeps where the runtime's event log was read up to (nil: not kept).
	pos *eventPos
}

// podState is what the node keeps of one pod, guarded by Provider.mu. A
// state can exist before the API shows the pod (runtime events, a
// DeletePod) and without one ever coming; it is forgotten once the pod's
// terminal status is sent.
type podState struct {
	// pod is the API's view of the pod with the status last reported; nil
	// while the node only heard of the uid. A stub (no containers) stands
	// for a pod the runtime runs that the API has not shown yet.
	pod *corev1.Pod
	// known: the runtime has this pod.
	known bool
	// retry is the pending start of a pod that could not start yet; a timer
	// that finds another one (or none) here was cancelled.
	retry *retryTimer
	// starts is the back-off between the pod's starts that failed
	// transiently (startRetry; reset once a start succeeds).
	starts backoff.Backoff
	// deleting: DeletePod was called; the pod is never (re)created.
	deleting bool
	// pending holds runtime events that arrived before the API showed the
	// pod (replayed after a restart); they are recorded once it arrives.
	pending []*runtimev1.PodEvent
	// rev is the newest runtime status revision applied, so a late reply
	// (a CreatePod response racing the watch) cannot roll a status back.
	rev uint64
	// gone: torn down, the terminal status still to be sent.
	gone bool
	// volumesHash is the files volumes last sent to the runtime.
	volumesHash [32]byte
	// stale is the pod's status in the API when it differed from the
	// node's in the last reconcile round (nil: it did not).
	stale *staleStatus
	// admitted: the node took the pod (admit); rejected: it did not, and
	// never starts it.
	admitted, rejected bool
}

// state returns uid's state, making it if there is none; with p.mu held.
func (p *Provider) state(uid types.UID) *podState {
	st := p.pods[uid]
	if st == nil {
		st = &podState{starts: startRetry}
		p.pods[uid] = st
	}
	return st
}

// forget drops everything the node keeps of a pod; with p.mu held.
func (p *Provider) forget(uid types.UID) {
	st := p.pods[uid]
	if st == nil {
		return
	}
	if st.retry != nil {
		st.retry.t.Stop()
	}
	if st.pod != nil && p.byName[key(st.pod.Namespace, st.pod.Name)] == uid {
		delete(p.byName, key(st.pod.Namespace, st.pod.Name))
	}
	delete(p.pods, uid)
}

// podOf is uid's pod (nil: none yet); with p.mu held.
func (p *Provider) podOf(uid types.UID) *corev1.Pod {
	if st := p.pods[uid]; st != nil {
		return st.pod
	}
	return nil
}

func newProvider(rt *client.Client, translator *podspec.Translator, nodeIP string, recorder record.EventRecorder, log *slog.Logger, instant bool) *Provider {
	return &Provider{rt: rt, translator: translator, nodeIP: nodeIP, recorder: recorder, log: log, instant: instant,
		pods: map[types.UID]*podState{}, byName: map[string]types.UID{}, retryDelay: 10 * time.Second,
		dirty: make(chan types.UID, 4096)}
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
	st := p.pods[pod.UID]
	deleting := st != nil && (st.deleting || st.gone)
	rejected := st != nil && st.rejected
	p.mu.Unlock()
	if deleting || rejected {
		return nil // DeletePod came first, or the node refused it: never start it
	}
	pod, known := p.adopt(pod)
	if !known && pod.Status.Phase != corev1.PodFailed && pod.Status.Phase != corev1.PodSucceeded {
		p.mu.Lock()
		reason, msg := "", ""
		if st := p.pods[pod.UID]; st == nil || !st.admitted {
			reason, msg = p.admit(pod.UID, pod)
		}
		p.mu.Unlock()
		if reason != "" {
			p.reject(pod, reason, msg)
			return nil
		}
	}
	if p.instant {
		if p.instantWrites {
			return p.instantWithWrites(ctx, pod)
		}
		p.publish(pod.UID, instantStatus(pod, p.nodeIP))
		return nil
	}
	spec, err := p.translator.PodSpec(ctx, pod)
	var te *podspec.TransientError
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
	var ce *podspec.ConfigError
	if errors.As(err, &ce) {
		p.configFailed(pod, ce)
		return nil
	}
	var ve *podspec.VolumeError
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
	st = p.state(pod.UID)
	st.known = true
	st.starts.Reset()
	p.mu.Unlock()
	p.sentVolumes(pod.UID, spec.Volumes)
	return nil
}

// adopt stores the API's view of a pod (keeping the status we last
// reported) and records runtime events that arrived before it did.
func (p *Provider) adopt(pod *corev1.Pod) (*corev1.Pod, bool) {
	pod = pod.DeepCopy()
	p.mu.Lock()
	st := p.state(pod.UID)
	if st.pod != nil {
		pod.Status = st.pod.Status
	}
	// A pod of the same name with another uid left the API (a name is
	// unique at any time): stop it, as the kubelet does by uid.
	var replaced *corev1.Pod
	if prev, ok := p.byName[key(pod.Namespace, pod.Name)]; ok && prev != pod.UID && (p.pods[prev] == nil || !p.pods[prev].gone) && p.isAPIPod(pod) {
		if old := p.podOf(prev); old != nil {
			replaced = old.DeepCopy()
		}
	}
	st.pod = pod
	p.byName[key(pod.Namespace, pod.Name)] = pod.UID
	known := st.known
	pending := st.pending
	st.pending = nil
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

// isAPIPod: the API's pod of pod's name is pod (or the node cannot tell).
// A late start of a pod the API replaced must not stop its successor.
func (p *Provider) isAPIPod(pod *corev1.Pod) bool {
	if p.apiUID == nil {
		return true
	}
	uid, found := p.apiUID(pod.Namespace, pod.Name)
	return !found || uid == pod.UID
}

// UpdatePod passes spec changes (e.g. a new image) to the runtime.
func (p *Provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	pod, known := p.adopt(pod)
	if p.instant || !known {
		return nil
	}
	spec, err := p.translator.PodSpec(ctx, pod)
	if err != nil {
		return nil // keep running what runs; the kubelet does not stop a pod for this
	}
	if _, err = p.rt.Runtime.UpdatePod(ctx, &runtimev1.UpdatePodRequest{Pod: spec}); err != nil {
		return err
	}
	// Labels and annotations show in downwardAPI volumes at once: the spec
	// just resolved carries them.
	p.sendVolumes(ctx, pod, spec.Volumes)
	if pod.Generation != pod.Status.ObservedGeneration {
		p.dirty <- pod.UID // the new generation is observed
	}
	return nil
}

// DeletePod starts a graceful stop; the terminal status follows through the
// runtime's watch once the pod is torn down.
func (p *Provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	st := p.state(pod.UID)
	st.deleting = true
	if rt := st.retry; rt != nil {
		rt.t.Stop()
		st.retry = nil
	}
	p.mu.Unlock()
	// A start under way finishes first: then the pod is known and is
	// deleted in the runtime too.
	unlock := p.podLocks.lock(pod.UID)
	defer unlock()
	p.mu.Lock()
	var known bool
	if st := p.pods[pod.UID]; st != nil {
		if cur := st.pod; cur != nil {
			cur.DeletionTimestamp = pod.DeletionTimestamp
			cur.DeletionGracePeriodSeconds = pod.DeletionGracePeriodSeconds
		}
		known = st.known
	}
	p.mu.Unlock()
	p.translator.Forget(pod.UID)
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
	st := p.pods[uid]
	ok := st != nil && st.pod != nil
	if ok {
		pod := st.pod
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
		st.gone = true
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
		var pod *corev1.Pod
		var final bool
		if st := p.pods[uid]; st != nil && st.pod != nil {
			pod, final = st.pod.DeepCopy(), st.gone
			if final {
				p.forget(uid)
			}
		}
		ok := pod != nil
		p.mu.Unlock()
		if !ok || pod.Spec.Containers == nil {
			continue // forgotten, or a stub the API has not shown us yet
		}
		// A spec update (a new generation) with no change in the runtime
		// is observed too.
		observe(pod.Generation, &pod.Status)
		notify(pod)
		p.publishHostPorts(pod, final)
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
	if pod := p.podOf(uid); pod != nil {
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
	for _, st := range p.pods {
		if st.pod != nil {
			out = append(out, st.pod.DeepCopy())
		}
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
	s := p.pods[uid]
	ok := s != nil && s.pod != nil
	if ok && !s.gone {
		s.pod.Status = st
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
	if st := p.pods[uid]; st != nil && rs.Revision < st.rev {
		p.mu.Unlock()
		return // older than what was applied already
	}
	st := p.state(uid)
	st.rev = rs.Revision
	if st.pod == nil {
		// A pod the runtime runs but the API has not shown us (yet): keep a
		// stub so GetPods reports it and Virtual Kubelet can reconcile.
		st.pod = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid, Namespace: rs.Namespace, Name: rs.Name}}
		p.byName[key(rs.Namespace, rs.Name)] = uid
	}
	wasKnown := st.known
	st.known = true
	evicted := false
	if !st.gone {
		evicted = wasKnown && st.pod.Status.Reason != "Evicted" && pressure.IsMemoryEviction(rs.Reason, rs.Message)
		st.pod.Status = podStatus(st.pod, rs, p.nodeIP, p.podNetwork)
	}
	onEviction := p.memoryEvicted
	p.mu.Unlock()
	if evicted && onEviction != nil {
		onEviction(rs.Namespace+"/"+rs.Name, rs.Message)
	}
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
	delay := backoff.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		stream, err := p.rt.Runtime.WatchPodStatus(ctx, &runtimev1.WatchPodStatusRequest{EventsBootId: bootID, EventsAfterSeq: seq})
		if err == nil {
			for {
				msg, err := stream.Recv()
				if err != nil {
					break
				}
				delay.Reset()
				if msg.BootId != "" && msg.BootId != bootID {
					bootID, seq = msg.BootId, 0
					if p.pos != nil {
						p.pos.set(watchPos{BootID: bootID, Seq: seq})
					}
					// Revisions count again from zero in a new daemon.
					p.mu.Lock()
					for _, st := range p.pods {
						st.rev = 0
					}
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
						pod := p.podOf(uid)
						if pod == nil || pod.Spec.Containers == nil {
							if st := p.state(uid); len(st.pending) < 64 {
								st.pending = append(st.pending, e)
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
		case <-time.After(delay.Next()):
		}
	}
}

func (p *Provider) runtimeEvent(pod *corev1.Pod, e *runtimev1.PodEvent) {
	typ := corev1.EventTypeNormal
	if e.Type == runtimev1.EventType_EVENT_TYPE_WARNING {
		typ = corev1.EventTypeWarning
	}
	p.event(pod, e.Container, typ, e.Reason, e.Message)
}
