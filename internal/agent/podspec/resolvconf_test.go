package podspec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corelisters "k8s.io/client-go/listers/core/v1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
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

func TestServiceLinksEnv(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	svc := func(ns, name, ip string, ports ...corev1.ServicePort) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: ports}}
	}
	idx.Add(svc("default", "kubernetes", "10.43.0.1", corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}))
	idx.Add(svc("shop", "web-db", "10.43.0.9", corev1.ServicePort{Name: "pg", Port: 5432, Protocol: corev1.ProtocolTCP}))
	idx.Add(svc("shop", "headless", "None", corev1.ServicePort{Port: 80}))
	idx.Add(svc("other", "x", "10.43.0.8", corev1.ServicePort{Port: 80}))
	env := ServiceLinksEnv(corelisters.NewServiceLister(idx), nil)
	vars := func(p *corev1.Pod) map[string]string {
		m := map[string]string{}
		for _, e := range env(p) {
			m[e.Name] = e.Value
		}
		return m
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "p"}}
	got := vars(pod)
	for k, want := range map[string]string{
		"KUBERNETES_SERVICE_HOST": "10.43.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_PORT": "tcp://10.43.0.1:443",
		"WEB_DB_SERVICE_HOST": "10.43.0.9", "WEB_DB_SERVICE_PORT_PG": "5432", "WEB_DB_PORT_5432_TCP_ADDR": "10.43.0.9",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	if _, ok := got["HEADLESS_SERVICE_HOST"]; ok {
		t.Error("a headless Service got service links")
	}
	if _, ok := got["X_SERVICE_HOST"]; ok {
		t.Error("a Service of another namespace got service links")
	}
	pod.Spec.EnableServiceLinks = ptr.To(false)
	got = vars(pod)
	if _, ok := got["WEB_DB_SERVICE_HOST"]; ok || got["KUBERNETES_SERVICE_HOST"] != "10.43.0.1" {
		t.Errorf("enableServiceLinks false: %v (want only the kubernetes Service's)", got)
	}
}
