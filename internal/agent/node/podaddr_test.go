package node

import (
	"net/netip"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The cluster DNS learns a pod address's namespace from the node's own
// pods; hostNetwork pods (the node's address) and torn down ones are not
// named.
func TestPodNamespace(t *testing.T) {
	p := newProvider(nil, podspec.New(podspec.Config{}), "192.0.2.1", nil, nil, false)
	add := func(uid, ns, ip string, hostNet, gone bool) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: uid, UID: types.UID(uid)},
			Spec:   corev1.PodSpec{HostNetwork: hostNet},
			Status: corev1.PodStatus{PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}}
		p.pods[pod.UID] = &podState{pod: pod, gone: gone}
	}
	add("a", "apps", "100.64.0.5", false, false)
	add("b", "ops", "fd00:64::5", false, false)
	add("h", "kube-system", "192.0.2.1", true, false)
	add("g", "old", "100.64.0.6", false, true)
	p.pods["stub"] = &podState{} // heard of, not seen
	for ip, want := range map[string]string{"100.64.0.5": "apps", "fd00:64::5": "ops", "192.0.2.1": "", "100.64.0.6": "", "100.64.0.7": ""} {
		ns, ok := p.podNamespace(netip.MustParseAddr(ip))
		if ns != want || ok != (want != "") {
			t.Errorf("podNamespace(%s) = %q %v, want %q", ip, ns, ok, want)
		}
	}
}
