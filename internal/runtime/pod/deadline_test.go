package pod

import (
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"k8s.io/utils/ptr"
)

func TestActiveDeadline(t *testing.T) {
	now := time.Now()
	p := &managedPod{m: &Manager{}, uid: "u", spec: &runtimev1.PodSpec{Uid: "u", ActiveDeadlineSeconds: ptr.To[int64](5)}}
	if p.pastDeadline(now) {
		t.Error("a pod that has not started is past its deadline")
	}
	p.startTime = now.Add(-4 * time.Second)
	if p.pastDeadline(now) {
		t.Error("past the deadline after 4 s of 5")
	}
	p.startTime = now.Add(-5 * time.Second)
	if !p.pastDeadline(now) {
		t.Error("not past the deadline after 5 s of 5")
	}
	p.spec.ActiveDeadlineSeconds = nil
	if p.pastDeadline(now) {
		t.Error("past a deadline it does not have")
	}
	// What fail leaves: Failed (no container runs) with the kubelet's
	// reason and message.
	p.evicted, p.failReason = messageDeadlineExceeded, reasonDeadlineExceeded
	st := p.status()
	if st.Phase != runtimev1.PodPhase_POD_PHASE_FAILED || st.Reason != reasonDeadlineExceeded || st.Message != messageDeadlineExceeded {
		t.Errorf("status %s %q %q", st.Phase, st.Reason, st.Message)
	}
	if p.pastDeadline(now) {
		t.Error("a failed pod fails again")
	}
}
