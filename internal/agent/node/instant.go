package node

// Instant mode, for the pod-start benchmark only: pods are reported
// Running at once and nothing is started (Provider.instant; CreatePod,
// UpdatePod and DeletePod skip the runtime). Never for real workloads.

import (
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
