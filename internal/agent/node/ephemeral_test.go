package node

import (
	"context"
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func debugPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "u1"},
		Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{Name: "app", Image: "native", Command: []string{"/bin/sleep", "600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			EphemeralContainers: []corev1.EphemeralContainer{
				{TargetContainerName: "app", EphemeralContainerCommon: corev1.EphemeralContainerCommon{
					Name: "debugger", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent,
					Command: []string{"sh"}, Args: []string{"-c", "ls /data"}, WorkingDir: "/tmp",
					Env:   []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
					Stdin: true, TTY: true,
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/mnt/data", ReadOnly: true}},
				}},
				{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "broken", Image: "busybox",
					Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "missing"}, Key: "k"}}}}}},
			},
		},
	}
}

// The runtime's ephemeral statuses land in status.ephemeralContainerStatuses
// (never ready), outside the pod's conditions; a deleted pod's are
// terminated.
func TestEphemeralContainerStatus(t *testing.T) {
	pod := debugPod()
	now := timestamppb.Now()
	rs := &runtimev1.PodStatus{Uid: "u1", Phase: runtimev1.PodPhase_POD_PHASE_RUNNING, Initialized: true, ContainersReady: true, Revision: 1,
		ContainerStatuses: []*runtimev1.ContainerStatus{{Name: "app", Ready: true, Started: true,
			State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{StartedAt: now}}}}},
		EphemeralContainerStatuses: []*runtimev1.ContainerStatus{{Name: "debugger", Image: "busybox:1.36", ImageId: "busybox@sha256:ab",
			ContainerId: "k3sm://x", Ready: true, Started: true,
			State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Terminated{Terminated: &runtimev1.ContainerStateTerminated{
				ExitCode: 3, Reason: "Error", StartedAt: now, FinishedAt: now, ContainerId: "k3sm://x"}}}}},
	}
	st := podStatus(pod, rs, "192.0.2.1", false)
	if len(st.EphemeralContainerStatuses) != 1 || len(st.ContainerStatuses) != 1 {
		t.Fatalf("statuses: %+v", st)
	}
	es := st.EphemeralContainerStatuses[0]
	if es.Name != "debugger" || es.Ready || es.Image != "busybox:1.36" || es.ImageID != "busybox@sha256:ab" || es.ContainerID != "k3sm://x" ||
		es.State.Terminated == nil || es.State.Terminated.ExitCode != 3 {
		t.Fatalf("ephemeral status %+v", es)
	}
	for _, c := range st.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
			t.Errorf("ready condition %v", c)
		}
	}
	if got := containerFieldPath(pod, "debugger"); got != "spec.ephemeralContainers{debugger}" {
		t.Errorf("field path %q", got)
	}
	if got := containerFieldPath(pod, "app"); got != "spec.containers{app}" {
		t.Errorf("field path %q", got)
	}

	// A running ephemeral container of a deleted pod reads terminated.
	rs.EphemeralContainerStatuses[0].State = &runtimev1.ContainerState{State: &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{StartedAt: now}}}
	p := newProvider(nil, podspec.New(podspec.Config{}), "192.0.2.1", nil, nil, false)
	p.adopt(pod)
	p.update(rs)
	p.finished(pod.UID)
	got, err := p.GetPod(context.Background(), "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	if es := got.Status.EphemeralContainerStatuses; len(es) != 1 || es[0].State.Terminated == nil {
		t.Fatalf("after delete: %+v", es)
	}
}
