package pod

import (
	"context"
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

func TestHTTPRequestDefaults(t *testing.T) {
	req, err := httpRequest(context.Background(), &runtimev1.HTTPGetAction{Port: 8080, Path: "healthz",
		Headers: []*runtimev1.EnvVar{{Name: "X-Probe", Value: "1"}, {Name: "Host", Value: "example.test"}}}, "100.64.0.7")
	if err != nil {
		t.Fatal(err)
	}
	if got := req.URL.String(); got != "http://100.64.0.7:8080/healthz" {
		t.Errorf("url %s", got)
	}
	if req.Host != "example.test" || req.Header.Get("X-Probe") != "1" || req.Header.Get("User-Agent") != probeUserAgent || req.Header.Get("Accept") != "*/*" {
		t.Errorf("request %v host %s", req.Header, req.Host)
	}
	req, _ = httpRequest(context.Background(), &runtimev1.HTTPGetAction{Port: 443, Host: "::1", Scheme: "HTTPS"}, "100.64.0.7")
	if got := req.URL.String(); got != "https://[::1]:443/" {
		t.Errorf("url %s", got)
	}
}

func TestLimitedBuffer(t *testing.T) {
	b := &limitedBuffer{max: 4}
	if n, err := b.Write([]byte("abc")); n != 3 || err != nil {
		t.Fatal(n, err)
	}
	if n, _ := b.Write([]byte("defg")); n != 4 || b.String() != "abcd" {
		t.Errorf("n %d, %q", n, b.String())
	}
}

func runningCS() *runtimev1.ContainerStatus {
	return &runtimev1.ContainerStatus{Started: true, State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{}}}}
}

func waitingCS() *runtimev1.ContainerStatus {
	return &runtimev1.ContainerStatus{State: &runtimev1.ContainerState{State: &runtimev1.ContainerState_Waiting{Waiting: &runtimev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}
}

func TestComputePhaseSidecars(t *testing.T) {
	always := runtimev1.RestartPolicy_RESTART_POLICY_ALWAYS
	notStarted := runningCS()
	notStarted.Started = false
	cases := []struct {
		name    string
		init    []*runtimev1.ContainerStatus
		main    []*runtimev1.ContainerStatus
		mainRan bool
		want    runtimev1.PodPhase
	}{
		{"sidecar not started yet", []*runtimev1.ContainerStatus{notStarted}, []*runtimev1.ContainerStatus{waitingCS()}, false, runtimev1.PodPhase_POD_PHASE_PENDING},
		{"sidecar started, main running", []*runtimev1.ContainerStatus{runningCS()}, []*runtimev1.ContainerStatus{runningCS()}, true, runtimev1.PodPhase_POD_PHASE_RUNNING},
		{"sidecar restarting after main ran", []*runtimev1.ContainerStatus{waitingCS()}, []*runtimev1.ContainerStatus{runningCS()}, true, runtimev1.PodPhase_POD_PHASE_RUNNING},
	}
	for _, c := range cases {
		if got := computePhase(always, c.init, c.main, []bool{true}, c.mainRan); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
