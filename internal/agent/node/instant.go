package node

// Instant mode, for the pod-start benchmark only: pods are reported
// Running at once and nothing is started (Provider.instant; CreatePod,
// UpdatePod and DeletePod skip the runtime). Never for real workloads.
// With instantWrites it is the fair floor: the node makes the API writes
// a real start makes, so that the real node's time over it is the cost of
// starting, not of the writes every kubelet makes.

import (
	"context"
	"fmt"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	corev1 "k8s.io/api/core/v1"
)

// instantStatus is the status instant mode reports: every container
// running and ready since now.
func instantStatus(pod *corev1.Pod, nodeIP string) corev1.PodStatus {
	now := timestampNow()
	rs := &runtimev1.PodStatus{Phase: runtimev1.PodPhase_POD_PHASE_RUNNING, Initialized: true, ContainersReady: true, StartTime: now}
	for _, c := range pod.Spec.Containers {
		rs.ContainerStatuses = append(rs.ContainerStatuses, &runtimev1.ContainerStatus{Name: c.Name, Image: c.Image, Ready: true, Started: true,
			State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{StartedAt: now}}}})
	}
	return podStatus(pod, rs, nodeIP, false)
}

// creatingStatus is the runtime's first status of a pod it accepted: its
// containers waiting in ContainerCreating.
func creatingStatus(pod *corev1.Pod, nodeIP string) corev1.PodStatus {
	rs := &runtimev1.PodStatus{Phase: runtimev1.PodPhase_POD_PHASE_PENDING, Initialized: true, StartTime: timestampNow()}
	for _, c := range pod.Spec.Containers {
		rs.ContainerStatuses = append(rs.ContainerStatuses, &runtimev1.ContainerStatus{Name: c.Name, Image: c.Image,
			State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Waiting{Waiting: &runtimev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}})
	}
	return podStatus(pod, rs, nodeIP, false)
}

// instantWithWrites starts nothing but writes what a real start of a pod
// whose image is present writes, in its order: the spec translated (its
// service account token requested, its ConfigMaps and Secrets read), the
// Pending status, Pulled, Created and Started for each container with the
// runtime's messages, then Running.
func (p *Provider) instantWithWrites(ctx context.Context, pod *corev1.Pod) error {
	if _, err := p.translator.PodSpec(ctx, pod); err != nil {
		return err
	}
	p.publish(pod.UID, creatingStatus(pod, p.nodeIP))
	// The rest comes later, as the runtime's events and statuses do after
	// CreatePod returned. A real start's Running comes tens of milliseconds
	// after its Pending, so both are written; published back to back, the
	// notifier would send only the newest: Running waits for Pending to be
	// in the API.
	ctx = context.WithoutCancel(ctx) // CreatePod's may end as it returns
	go func() {
		p.waitWritten(ctx, pod, func(st corev1.PodStatus) bool {
			return len(st.ContainerStatuses) > 0 && st.ContainerStatuses[0].State.Waiting != nil
		})
		for _, c := range pod.Spec.Containers {
			p.event(pod, c.Name, corev1.EventTypeNormal, "Pulled", fmt.Sprintf("Container image %q already present on machine", c.Image))
			p.event(pod, c.Name, corev1.EventTypeNormal, "Created", "Created container "+c.Name)
			p.event(pod, c.Name, corev1.EventTypeNormal, "Started", "Started container "+c.Name)
		}
		p.publish(pod.UID, instantStatus(pod, p.nodeIP))
	}()
	return nil
}

// waitWritten polls the informer's copy of pod until written reports its
// status (or 10 s pass, or no informer is wired: unit tests).
func (p *Provider) waitWritten(ctx context.Context, pod *corev1.Pod, written func(corev1.PodStatus) bool) {
	if p.apiPod == nil {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if cur, ok := p.apiPod(pod.Namespace, pod.Name); ok && cur.UID == pod.UID && written(cur.Status) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}
