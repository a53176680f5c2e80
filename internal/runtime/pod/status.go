package pod

// The API status of a pod and its containers (runtimev1), built from
// their in-memory state.

import (
	"slices"

	"google.golang.org/protobuf/types/known/timestamppb"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// status builds the API status.
func (p *managedPod) status() *runtimev1.PodStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statusLocked()
}

func (p *managedPod) statusLocked() *runtimev1.PodStatus {
	st := &runtimev1.PodStatus{Uid: p.uid, Namespace: p.spec.GetNamespace(), Name: p.spec.GetName(),
		Terminating: p.terminating, Revision: p.revision, PodIp: p.net.IP}
	if !p.startTime.IsZero() {
		st.StartTime = timestamppb.New(p.startTime)
	}
	for _, c := range p.init {
		st.InitContainerStatuses = append(st.InitContainerStatuses, c.apiStatus())
	}
	// Initialized: every init container succeeded and every native sidecar
	// started (once the main containers ran, a restarting sidecar does not
	// take it back).
	mainRan := false
	for _, c := range p.main {
		mainRan = mainRan || c.hasRun
	}
	st.Initialized = true
	var sidecars []bool
	for i, c := range p.init {
		sidecars = append(sidecars, c.sidecar())
		if c.sidecar() {
			if !mainRan && !st.InitContainerStatuses[i].GetStarted() {
				st.Initialized = false
			}
			continue
		}
		if !c.succeeded() {
			st.Initialized = false
		}
	}
	st.ContainersReady = true
	for i, c := range p.init {
		if c.sidecar() && !st.InitContainerStatuses[i].GetReady() {
			st.ContainersReady = false
		}
	}
	for _, c := range p.main {
		cs := c.apiStatus()
		if !st.Initialized {
			cs.Ready = false
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
		if !cs.Ready {
			st.ContainersReady = false
		}
	}
	if len(p.init) > 0 {
		// As the kubelet: in a pod with init containers, a container not
		// tried yet waits as PodInitializing.
		for i, c := range p.init {
			podInitializing(c, st.InitContainerStatuses[i])
		}
		for i, c := range p.main {
			podInitializing(c, st.ContainerStatuses[i])
		}
	}
	for _, c := range p.ephemeral {
		st.EphemeralContainerStatuses = append(st.EphemeralContainerStatuses, c.apiStatus())
	}
	st.Phase = computePhase(p.spec.GetRestartPolicy(), st.InitContainerStatuses, st.ContainerStatuses, sidecars, mainRan)
	if p.evicted != "" {
		// Failed once every container stopped, as the kubelet reports it.
		st.Reason, st.Message = "Evicted", p.evicted
		if p.failReason != "" {
			st.Reason = p.failReason
		}
		if !slices.ContainsFunc(p.all(), func(c *container) bool { return c.state.Running != nil }) {
			st.Phase = runtimev1.PodPhase_POD_PHASE_FAILED
		}
	}
	return st
}

// podInitializing marks cs PodInitializing while c was never tried.
func podInitializing(c *container, cs *runtimev1.ContainerStatus) {
	if w := cs.GetState().GetWaiting(); w != nil && !c.hasRun && w.GetReason() == "ContainerCreating" {
		w.Reason = "PodInitializing"
	}
}

func termProto(t *terminated) *runtimev1.ContainerState {
	return &runtimev1.ContainerState{State: &runtimev1.ContainerState_Terminated{Terminated: &runtimev1.ContainerStateTerminated{
		ExitCode: int32(t.ExitCode), Signal: int32(t.Signal), Reason: t.Reason, Message: t.Message,
		StartedAt: timestamppb.New(t.StartedAt), FinishedAt: timestamppb.New(t.FinishedAt), ContainerId: t.ContainerID}}}
}

func (c *container) apiStatus() *runtimev1.ContainerStatus {
	cs := &runtimev1.ContainerStatus{Name: c.spec.GetName(), RestartCount: c.restartCount, Image: c.spec.GetImage(),
		ImageId: c.imageID, ImageDigest: c.imageDigest, ContainerId: c.containerID}
	if c.imageDigest == "" && c.spec.GetImage() == NativeImage {
		cs.ImageId = NativeImage
	}
	switch {
	case c.state.Running != nil:
		cs.State = &runtimev1.ContainerState{State: &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{
			StartedAt: timestamppb.New(c.state.Running.StartedAt)}}}
		// Started once postStart completed and the startup probe passed;
		// ready while the readiness probe passes (regular init containers
		// and ephemeral containers are never ready).
		cs.Started = c.probeStarted
		cs.Ready = c.probeStarted && c.probeReady && (!c.init || c.sidecar()) && !c.ephemeral
	case c.state.Terminated != nil:
		cs.State = termProto(c.state.Terminated)
	default:
		w := c.state.Waiting
		if w == nil {
			w = &waiting{Reason: "ContainerCreating"}
		}
		cs.State = &runtimev1.ContainerState{State: &runtimev1.ContainerState_Waiting{Waiting: &runtimev1.ContainerStateWaiting{Reason: w.Reason, Message: w.Message}}}
	}
	if c.last != nil {
		cs.LastTerminationState = termProto(c.last)
	}
	return cs
}
