package pod

import runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"

// computePhase derives the pod phase from its container statuses with the
// kubelet's rules (pkg/kubelet/kubelet_pods.go getPhase). sidecar flags the
// native sidecars among init: they count as initialized once started (or
// once the main containers ran) and never decide the phase afterwards.
func computePhase(policy runtimev1.RestartPolicy, init, main []*runtimev1.ContainerStatus, sidecar []bool, mainRan bool) runtimev1.PodPhase {
	for i, s := range init {
		if i < len(sidecar) && sidecar[i] {
			if s.GetStarted() || mainRan {
				continue
			}
			return runtimev1.PodPhase_POD_PHASE_PENDING
		}
		if t := s.GetState().GetTerminated(); t != nil && t.GetExitCode() == 0 {
			continue
		}
		failed := false
		if t := s.GetState().GetTerminated(); t != nil {
			failed = true
		} else if s.GetState().GetWaiting() != nil && s.GetLastTerminationState().GetTerminated() != nil {
			failed = true
		}
		if failed && policy == runtimev1.RestartPolicy_RESTART_POLICY_NEVER {
			return runtimev1.PodPhase_POD_PHASE_FAILED
		}
		return runtimev1.PodPhase_POD_PHASE_PENDING
	}
	var running, waiting, stopped, succeeded, failed int
	for _, s := range main {
		switch {
		case s.GetState().GetRunning() != nil:
			running++
		case s.GetState().GetTerminated() != nil:
			stopped++
			if s.GetState().GetTerminated().GetExitCode() == 0 {
				succeeded++
			} else {
				failed++
			}
		default:
			if lt := s.GetLastTerminationState().GetTerminated(); lt != nil {
				stopped++
				if lt.GetExitCode() == 0 {
					succeeded++
				} else {
					failed++
				}
			} else {
				waiting++
			}
		}
	}
	switch {
	case waiting > 0:
		return runtimev1.PodPhase_POD_PHASE_PENDING
	case running > 0:
		return runtimev1.PodPhase_POD_PHASE_RUNNING
	case stopped > 0:
		switch policy {
		case runtimev1.RestartPolicy_RESTART_POLICY_NEVER:
			if failed > 0 {
				return runtimev1.PodPhase_POD_PHASE_FAILED
			}
			return runtimev1.PodPhase_POD_PHASE_SUCCEEDED
		case runtimev1.RestartPolicy_RESTART_POLICY_ON_FAILURE:
			if stopped == succeeded {
				return runtimev1.PodPhase_POD_PHASE_SUCCEEDED
			}
			return runtimev1.PodPhase_POD_PHASE_RUNNING
		default:
			return runtimev1.PodPhase_POD_PHASE_RUNNING
		}
	}
	return runtimev1.PodPhase_POD_PHASE_PENDING
}

// shouldRestart applies the restart policy to an exit code.
func shouldRestart(policy runtimev1.RestartPolicy, exitCode int) bool {
	switch policy {
	case runtimev1.RestartPolicy_RESTART_POLICY_NEVER:
		return false
	case runtimev1.RestartPolicy_RESTART_POLICY_ON_FAILURE:
		return exitCode != 0
	}
	return true
}
