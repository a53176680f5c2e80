package node

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
)

// A pod bound to the node whose hostPort another pod there holds is
// rejected as the kubelet rejects it; another address or protocol fits.
func TestAdmissionRejectsHostPortConflict(t *testing.T) {
	p := newProvider(nil, podspec.New(podspec.Config{Source: fakeSource{}}), "192.0.2.1", nil, quiet(), true)
	pod := func(name, ip string, proto corev1.Protocol) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
				{ContainerPort: 8080, HostPort: 54323, HostIP: ip, Protocol: proto}}}}}}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		pod    *corev1.Pod
		reason string
	}{
		{pod("first", "", corev1.ProtocolTCP), ""},
		{pod("same-port", "192.0.2.1", corev1.ProtocolTCP), reasonNodePorts},
		{pod("udp", "192.0.2.1", corev1.ProtocolUDP), ""},
		{pod("udp-again", "", corev1.ProtocolUDP), reasonNodePorts},
	} {
		if err := p.CreatePod(ctx, tc.pod); err != nil {
			t.Fatal(err)
		}
		st, err := p.GetPodStatus(ctx, "ns", tc.pod.Name)
		if err != nil {
			t.Fatal(err)
		}
		if tc.reason == "" && st.Phase == corev1.PodFailed {
			t.Errorf("%s rejected: %s %s", tc.pod.Name, st.Reason, st.Message)
		}
		if tc.reason != "" && (st.Phase != corev1.PodFailed || st.Reason != tc.reason || st.Message == "") {
			t.Errorf("%s: phase %s reason %q message %q, want Failed %q", tc.pod.Name, st.Phase, st.Reason, st.Message, tc.reason)
		}
	}
	// Once the first pod ended, its port is free.
	if err := p.DeletePod(ctx, pod("first", "", corev1.ProtocolTCP)); err != nil {
		t.Fatal(err)
	}
	if err := p.CreatePod(ctx, pod("after", "", corev1.ProtocolTCP)); err != nil {
		t.Fatal(err)
	}
	if st, _ := p.GetPodStatus(ctx, "ns", "after"); st == nil || st.Phase == corev1.PodFailed {
		t.Errorf("a pod after the holder was deleted: %+v", st)
	}
}
