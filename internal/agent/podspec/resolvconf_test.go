package podspec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestResolvConf(t *testing.T) {
	host := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(host, []byte("# host\nnameserver 127.0.0.53\nnameserver 192.0.2.53\nsearch corp.example\noptions edns0 trust-ad\n"), 0o644)
	d := &DNS{Server: "10.43.0.10", Domain: "cluster.local", HostResolvConf: host}
	pod := func(policy corev1.DNSPolicy, hostNet bool, cfg *corev1.PodDNSConfig) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "p"},
			Spec: corev1.PodSpec{DNSPolicy: policy, HostNetwork: hostNet, DNSConfig: cfg}}
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"ClusterFirst (default)", pod("", false, nil),
			"nameserver 10.43.0.10\nsearch shop.svc.cluster.local svc.cluster.local cluster.local corp.example\noptions ndots:5\n"},
		{"ClusterFirst on the host network is Default", pod(corev1.DNSClusterFirst, true, nil),
			"nameserver 192.0.2.53\nsearch corp.example\noptions edns0 trust-ad\n"},
		{"ClusterFirstWithHostNet", pod(corev1.DNSClusterFirstWithHostNet, true, nil),
			"nameserver 10.43.0.10\nsearch shop.svc.cluster.local svc.cluster.local cluster.local corp.example\noptions ndots:5\n"},
		{"Default", pod(corev1.DNSDefault, false, nil),
			"nameserver 192.0.2.53\nsearch corp.example\noptions edns0 trust-ad\n"},
		{"None with dnsConfig", pod(corev1.DNSNone, false, &corev1.PodDNSConfig{Nameservers: []string{"192.0.2.1"}, Searches: []string{"a.example"},
			Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("2")}, {Name: "rotate"}}}),
			"nameserver 192.0.2.1\nsearch a.example\noptions ndots:2 rotate\n"},
		{"dnsConfig merges, its ndots wins", pod("", false, &corev1.PodDNSConfig{Searches: []string{"x.example"}, Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("1")}}}),
			"nameserver 10.43.0.10\nsearch shop.svc.cluster.local svc.cluster.local cluster.local corp.example x.example\noptions ndots:1\n"},
	}
	for _, c := range cases {
		got, err := ResolvConf(c.pod, d)
		if err != nil || got != c.want {
			t.Errorf("%s:\n%q %v\nwant\n%q", c.name, got, err, c.want)
		}
	}
	if got, err := ResolvConf(pod("", false, nil), nil); got != "" || err != nil {
		t.Errorf("no cluster DNS: %q %v, want the node's own file", got, err)
	}
	if _, err := ResolvConf(pod(corev1.DNSNone, false, nil), d); err == nil || !strings.Contains(err.Error(), "spec.dnsConfig") {
		t.Errorf("None without dnsConfig: %v", err)
	}
}
