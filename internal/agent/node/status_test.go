package node

import (
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// The false Initialized, ContainersReady and Ready conditions carry the
// kubelet's messages, which clients and the conformance specs read.
func TestConditionMessagesAsKubelet(t *testing.T) {
	always := ptr.To(corev1.ContainerRestartPolicyAlways)
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init"}, {Name: "sidecar", RestartPolicy: always}},
		Containers:     []corev1.Container{{Name: "a"}, {Name: "b"}, {Name: "c"}},
	}}
	waitingState := &runtimev1.ContainerState{State: &runtimev1.ContainerState_Waiting{Waiting: &runtimev1.ContainerStateWaiting{Reason: "PodInitializing"}}}
	rs := &runtimev1.PodStatus{Uid: "u", Phase: runtimev1.PodPhase_POD_PHASE_PENDING,
		InitContainerStatuses: []*runtimev1.ContainerStatus{{Name: "init", State: waitingState}, {Name: "sidecar", State: waitingState}},
		ContainerStatuses:     []*runtimev1.ContainerStatus{{Name: "a", State: waitingState}, {Name: "b", Ready: true, State: waitingState}},
	}
	st := podStatus(pod, rs, "192.0.2.1", false)
	want := map[corev1.PodConditionType][2]string{
		corev1.PodInitialized:  {"ContainersNotInitialized", "containers with incomplete status: [init sidecar]"},
		corev1.ContainersReady: {"ContainersNotReady", "containers with unknown status: [c], containers with unready status: [sidecar a]"},
		corev1.PodReady:        {"ContainersNotReady", "containers with unknown status: [c], containers with unready status: [sidecar a]"},
	}
	for _, c := range st.Conditions {
		if w, ok := want[c.Type]; ok {
			if c.Status != corev1.ConditionFalse || c.Reason != w[0] || c.Message != w[1] {
				t.Errorf("%s: %s %q %q, want False %q %q", c.Type, c.Status, c.Reason, c.Message, w[0], w[1])
			}
			delete(want, c.Type)
		}
	}
	if len(want) > 0 {
		t.Errorf("conditions missing: %v", want)
	}

	rs.Phase = runtimev1.PodPhase_POD_PHASE_FAILED
	for _, c := range podStatus(pod, rs, "192.0.2.1", false).Conditions {
		if (c.Type == corev1.PodReady || c.Type == corev1.ContainersReady) && (c.Reason != "PodFailed" || c.Message != "") {
			t.Errorf("failed pod: %s reason %q message %q, want PodFailed and no message", c.Type, c.Reason, c.Message)
		}
	}
}

// An init container that completed is Ready, as the kubelet reports it.
func TestCompletedInitContainerIsReady(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: "ok"}, {Name: "bad"}}, Containers: []corev1.Container{{Name: "c"}}}}
	term := func(code int32) *runtimev1.ContainerState {
		return &runtimev1.ContainerState{State: &runtimev1.ContainerState_Terminated{Terminated: &runtimev1.ContainerStateTerminated{ExitCode: code}}}
	}
	rs := &runtimev1.PodStatus{Uid: "u", Phase: runtimev1.PodPhase_POD_PHASE_PENDING,
		InitContainerStatuses: []*runtimev1.ContainerStatus{{Name: "ok", State: term(0)}, {Name: "bad", State: term(1)}}}
	st := podStatus(pod, rs, "192.0.2.1", false)
	if !st.InitContainerStatuses[0].Ready || st.InitContainerStatuses[1].Ready {
		t.Errorf("ready: ok %v (want true), bad %v (want false)", st.InitContainerStatuses[0].Ready, st.InitContainerStatuses[1].Ready)
	}
}

// The status says which generation of the pod it is of, as the kubelet's.
func TestStatusObservesGeneration(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	pod.Generation = 3
	st := podStatus(pod, &runtimev1.PodStatus{Uid: "u", Phase: runtimev1.PodPhase_POD_PHASE_RUNNING}, "192.0.2.1", false)
	if st.ObservedGeneration != 3 {
		t.Errorf("observedGeneration %d, want 3", st.ObservedGeneration)
	}
	for _, c := range st.Conditions {
		if want := int64(3); c.Type != corev1.PodScheduled && c.ObservedGeneration != want {
			t.Errorf("condition %s observedGeneration %d, want %d", c.Type, c.ObservedGeneration, want)
		}
	}
}
