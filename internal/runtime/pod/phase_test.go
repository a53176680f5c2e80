package pod

import (
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

func st(kind string, code int32, last bool) *runtimev1.ContainerStatus {
	s := &runtimev1.ContainerStatus{State: &runtimev1.ContainerState{}}
	switch kind {
	case "run":
		s.State.State = &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{}}
	case "term":
		s.State.State = &runtimev1.ContainerState_Terminated{Terminated: &runtimev1.ContainerStateTerminated{ExitCode: code}}
	case "wait":
		s.State.State = &runtimev1.ContainerState_Waiting{Waiting: &runtimev1.ContainerStateWaiting{}}
		if last {
			s.LastTerminationState = &runtimev1.ContainerState{State: &runtimev1.ContainerState_Terminated{Terminated: &runtimev1.ContainerStateTerminated{ExitCode: code}}}
		}
	}
	return s
}

func TestComputePhase(t *testing.T) {
	A, O, N := runtimev1.RestartPolicy_RESTART_POLICY_ALWAYS, runtimev1.RestartPolicy_RESTART_POLICY_ON_FAILURE, runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	P, R, S, F := runtimev1.PodPhase_POD_PHASE_PENDING, runtimev1.PodPhase_POD_PHASE_RUNNING, runtimev1.PodPhase_POD_PHASE_SUCCEEDED, runtimev1.PodPhase_POD_PHASE_FAILED
	cases := []struct {
		name   string
		policy runtimev1.RestartPolicy
		init   []*runtimev1.ContainerStatus
		main   []*runtimev1.ContainerStatus
		want   runtimev1.PodPhase
	}{
		{"nothing started", A, nil, []*runtimev1.ContainerStatus{st("wait", 0, false)}, P},
		{"running", A, nil, []*runtimev1.ContainerStatus{st("run", 0, false)}, R},
		{"one waiting one running", A, nil, []*runtimev1.ContainerStatus{st("run", 0, false), st("wait", 0, false)}, P},
		{"crashloop is running", A, nil, []*runtimev1.ContainerStatus{st("wait", 1, true)}, R},
		{"init running", A, []*runtimev1.ContainerStatus{st("run", 0, false)}, []*runtimev1.ContainerStatus{st("wait", 0, false)}, P},
		{"init failed never", N, []*runtimev1.ContainerStatus{st("term", 2, false)}, []*runtimev1.ContainerStatus{st("wait", 0, false)}, F},
		{"init failed always retries", A, []*runtimev1.ContainerStatus{st("wait", 2, true)}, []*runtimev1.ContainerStatus{st("wait", 0, false)}, P},
		{"job ok", N, nil, []*runtimev1.ContainerStatus{st("term", 0, false)}, S},
		{"job failed", N, nil, []*runtimev1.ContainerStatus{st("term", 3, false), st("term", 0, false)}, F},
		{"onfailure done", O, []*runtimev1.ContainerStatus{st("term", 0, false)}, []*runtimev1.ContainerStatus{st("term", 0, false)}, S},
		{"onfailure retrying", O, nil, []*runtimev1.ContainerStatus{st("wait", 1, true)}, R},
		{"always all exited", A, nil, []*runtimev1.ContainerStatus{st("term", 0, false)}, R},
	}
	for _, c := range cases {
		if got := computePhase(c.policy, c.init, c.main, nil, false); got != c.want {
			t.Errorf("%s: phase %v, want %v", c.name, got, c.want)
		}
	}
}
