package node

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
)

func TestHostPortsOf(t *testing.T) {
	pod := &corev1.Pod{
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{ContainerPort: 8080, HostPort: 54323, HostIP: "127.0.0.1"},
			{ContainerPort: 8080, HostPort: 54323, Protocol: corev1.ProtocolUDP},
			{ContainerPort: 9090}, // no hostPort
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "100.64.0.9"},
	}
	target := netip.MustParseAddrPort("100.64.0.9:8080")
	want := []proxy.HostPort{
		{Protocol: corev1.ProtocolTCP, HostIP: netip.MustParseAddr("127.0.0.1"), Port: 54323, Target: target},
		{Protocol: corev1.ProtocolUDP, Port: 54323, Target: target},
	}
	got := hostPortsOf(pod, false, true)
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("hostPortsOf = %+v, want %+v", got, want)
	}
	for name, f := range map[string]func(*corev1.Pod) (bool, bool){
		"ended":               func(p *corev1.Pod) (bool, bool) { p.Status.Phase = corev1.PodSucceeded; return false, true },
		"deleted":             func(p *corev1.Pod) (bool, bool) { return true, true },
		"no address yet":      func(p *corev1.Pod) (bool, bool) { p.Status.PodIP = ""; return false, true },
		"in the node network": func(p *corev1.Pod) (bool, bool) { p.Spec.HostNetwork = true; return false, true },
		"no pod network":      func(p *corev1.Pod) (bool, bool) { return false, false },
	} {
		p := pod.DeepCopy()
		final, podNetwork := f(p)
		if got := hostPortsOf(p, final, podNetwork); got != nil {
			t.Errorf("%s: %+v, want none", name, got)
		}
	}
}
