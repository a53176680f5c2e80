package node

import (
	"fmt"
	"strings"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podStatus maps the runtime's status onto the Kubernetes PodStatus of pod,
// keeping condition transition times stable across updates. podNetwork: the
// runtime gives pods addresses of their own, so a pod without one yet has
// no podIP (hostNetwork pods always have the node's).
func podStatus(pod *corev1.Pod, rs *runtimev1.PodStatus, nodeIP string, podNetwork bool) corev1.PodStatus {
	prev := pod.Status
	st := corev1.PodStatus{
		Phase:    phase(rs.Phase),
		Reason:   rs.Reason,
		Message:  rs.Message,
		HostIP:   nodeIP,
		QOSClass: prev.QOSClass,
	}
	if nodeIP != "" {
		st.HostIPs = []corev1.HostIP{{IP: nodeIP}}
	}
	podIP := rs.PodIp
	if podIP == "" && (pod.Spec.HostNetwork || !podNetwork) {
		podIP = nodeIP
	}
	if podIP != "" {
		st.PodIP = podIP
		st.PodIPs = []corev1.PodIP{{IP: podIP}}
	}
	if rs.StartTime != nil {
		t := metav1.NewTime(rs.StartTime.AsTime())
		st.StartTime = &t
	} else {
		st.StartTime = prev.StartTime
	}
	sidecars := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		sidecars[c.Name] = c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
	}
	for _, cs := range rs.InitContainerStatuses {
		ics := containerStatus(cs)
		if t := ics.State.Terminated; !sidecars[cs.Name] && t != nil {
			// The kubelet marks an init container that completed Ready.
			ics.Ready = t.ExitCode == 0
		}
		st.InitContainerStatuses = append(st.InitContainerStatuses, ics)
	}
	for _, cs := range rs.ContainerStatuses {
		st.ContainerStatuses = append(st.ContainerStatuses, containerStatus(cs))
	}
	for _, cs := range rs.EphemeralContainerStatuses {
		ecs := containerStatus(cs)
		// The kubelet reports neither for ephemeral containers.
		ecs.Ready, ecs.Started = false, nil
		st.EphemeralContainerStatuses = append(st.EphemeralContainerStatuses, ecs)
	}
	terminal := st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed
	ready := rs.ContainersReady && !terminal
	initialized := condition(prev, corev1.PodInitialized, rs.Initialized, "ContainersNotInitialized")
	containersReady := condition(prev, corev1.ContainersReady, ready, "ContainersNotReady")
	if !rs.Initialized {
		initialized.Message = incompleteInit(pod, st.InitContainerStatuses)
	}
	if !ready && !terminal {
		containersReady.Message = unreadyContainers(pod, st.InitContainerStatuses, st.ContainerStatuses)
	}
	podReady := containersReady
	podReady.Type = corev1.PodReady
	st.Conditions = []corev1.PodCondition{
		condition(prev, corev1.PodReadyToStartContainers, rs.Phase != runtimev1.PodPhase_POD_PHASE_PENDING || rs.StartTime != nil, ""),
		initialized,
		containersReady,
		keepTransition(prev, podReady),
		condition(prev, corev1.PodScheduled, true, ""),
	}
	if rs.Reason == "Evicted" {
		// As the kubelet's eviction manager marks its evictions.
		c := condition(prev, corev1.DisruptionTarget, true, "")
		c.Reason, c.Message = corev1.PodReasonTerminationByKubelet, rs.Message
		st.Conditions = append(st.Conditions, c)
	}
	observe(pod.Generation, &st)
	if terminal {
		// The kubelet reports PodCompleted and PodFailed for finished pods.
		reason := "PodFailed"
		if rs.Phase == runtimev1.PodPhase_POD_PHASE_SUCCEEDED {
			reason = "PodCompleted"
		}
		for i := range st.Conditions {
			if t := st.Conditions[i].Type; t == corev1.ContainersReady || t == corev1.PodReady {
				st.Conditions[i].Reason = reason
			}
		}
	}
	return st
}

// observe marks st as the status of generation, as the kubelet does
// (status.observedGeneration and that of the conditions it owns).
func observe(generation int64, st *corev1.PodStatus) {
	st.ObservedGeneration = generation
	for i := range st.Conditions {
		if st.Conditions[i].Type != corev1.PodScheduled {
			st.Conditions[i].ObservedGeneration = generation
		}
	}
}

// keepTransition keeps c's transition time from prev when its status did
// not change.
func keepTransition(prev corev1.PodStatus, c corev1.PodCondition) corev1.PodCondition {
	c.LastTransitionTime = metav1.Now()
	for _, p := range prev.Conditions {
		if p.Type == c.Type && p.Status == c.Status {
			c.LastTransitionTime = p.LastTransitionTime
		}
	}
	return c
}

// unreadyContainers is the kubelet's message of a false ContainersReady:
// the containers (and sidecars) without a status, then those not ready.
func unreadyContainers(pod *corev1.Pod, initStatuses, statuses []corev1.ContainerStatus) string {
	var unknown, unready []string
	check := func(name string, sts []corev1.ContainerStatus) {
		for _, cs := range sts {
			if cs.Name == name {
				if !cs.Ready {
					unready = append(unready, name)
				}
				return
			}
		}
		unknown = append(unknown, name)
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			check(c.Name, initStatuses)
		}
	}
	for _, c := range pod.Spec.Containers {
		check(c.Name, statuses)
	}
	var msgs []string
	if len(unknown) > 0 {
		msgs = append(msgs, fmt.Sprintf("containers with unknown status: %v", unknown))
	}
	if len(unready) > 0 {
		msgs = append(msgs, fmt.Sprintf("containers with unready status: %v", unready))
	}
	return strings.Join(msgs, ", ")
}

// incompleteInit is the kubelet's message of a false Initialized: the init
// containers that have not completed (sidecars: not started).
func incompleteInit(pod *corev1.Pod, statuses []corev1.ContainerStatus) string {
	var names []string
	for _, c := range pod.Spec.InitContainers {
		done := false
		for _, cs := range statuses {
			if cs.Name != c.Name {
				continue
			}
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				done = cs.Started != nil && *cs.Started
			} else {
				done = cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0
			}
		}
		if !done {
			names = append(names, c.Name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf("containers with incomplete status: %v", names)
}

func condition(prev corev1.PodStatus, t corev1.PodConditionType, ok bool, falseReason string) corev1.PodCondition {
	status := corev1.ConditionFalse
	if ok {
		status = corev1.ConditionTrue
	}
	c := corev1.PodCondition{Type: t, Status: status}
	if !ok {
		c.Reason = falseReason
	}
	c.LastTransitionTime = metav1.Now()
	for _, p := range prev.Conditions {
		if p.Type == t && p.Status == status {
			c.LastTransitionTime = p.LastTransitionTime
			if p.LastProbeTime.IsZero() {
				c.LastProbeTime = p.LastProbeTime
			}
		}
	}
	return c
}

func phase(p runtimev1.PodPhase) corev1.PodPhase {
	switch p {
	case runtimev1.PodPhase_POD_PHASE_RUNNING:
		return corev1.PodRunning
	case runtimev1.PodPhase_POD_PHASE_SUCCEEDED:
		return corev1.PodSucceeded
	case runtimev1.PodPhase_POD_PHASE_FAILED:
		return corev1.PodFailed
	}
	return corev1.PodPending
}

func containerStatus(cs *runtimev1.ContainerStatus) corev1.ContainerStatus {
	started := cs.Started
	st := corev1.ContainerStatus{
		Name:                 cs.Name,
		State:                containerState(cs.State),
		LastTerminationState: containerState(cs.LastTerminationState),
		Ready:                cs.Ready,
		RestartCount:         cs.RestartCount,
		Image:                cs.Image,
		ImageID:              cs.ImageId,
		ContainerID:          cs.ContainerId,
		Started:              &started,
	}
	if w := st.State.Waiting; w != nil && w.Reason == "ContainerCreating" {
		// As the kubelet reports it: no container or image id until the
		// container exists. The runtime names the attempt before its
		// start, and showing that would cost every pod one more status
		// write before Running.
		st.ContainerID, st.ImageID = "", ""
	}
	return st
}

func containerState(s *runtimev1.ContainerState) corev1.ContainerState {
	if s == nil {
		return corev1.ContainerState{}
	}
	switch v := s.State.(type) {
	case *runtimev1.ContainerState_Waiting:
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: v.Waiting.Reason, Message: v.Waiting.Message}}
	case *runtimev1.ContainerState_Running:
		return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: ts(v.Running.StartedAt)}}
	case *runtimev1.ContainerState_Terminated:
		t := v.Terminated
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: t.ExitCode, Signal: t.Signal, Reason: t.Reason, Message: t.Message,
			StartedAt: ts(t.StartedAt), FinishedAt: ts(t.FinishedAt), ContainerID: t.ContainerId,
		}}
	}
	return corev1.ContainerState{}
}

func ts(t *timestamppb.Timestamp) metav1.Time {
	if t == nil {
		return metav1.Time{}
	}
	return metav1.NewTime(t.AsTime())
}

// waitingStatus is the status of a pod the node could not hand to the
// runtime (e.g. CreateContainerConfigError).
func waitingStatus(pod *corev1.Pod, reason, message, container, nodeIP string) corev1.PodStatus {
	rs := &runtimev1.PodStatus{Phase: runtimev1.PodPhase_POD_PHASE_PENDING}
	add := func(list *[]*runtimev1.ContainerStatus, cs []corev1.Container) {
		for _, c := range cs {
			st := &runtimev1.ContainerStatus{Name: c.Name, Image: c.Image, State: &runtimev1.ContainerState{
				State: &runtimev1.ContainerState_Waiting{Waiting: &runtimev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}
			if c.Name == container || container == "" {
				st.State = &runtimev1.ContainerState{State: &runtimev1.ContainerState_Waiting{
					Waiting: &runtimev1.ContainerStateWaiting{Reason: reason, Message: message}}}
			}
			*list = append(*list, st)
		}
	}
	add(&rs.InitContainerStatuses, pod.Spec.InitContainers)
	add(&rs.ContainerStatuses, pod.Spec.Containers)
	return podStatus(pod, rs, nodeIP, false)
}

func timestampNow() *timestamppb.Timestamp { return timestamppb.Now() }
