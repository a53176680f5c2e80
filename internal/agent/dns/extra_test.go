package dns

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

func TestDualStackAndOddServices(t *testing.T) {
	dual := service("default", "dual", "10.43.0.30", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	dual.Spec.ClusterIPs = []string{"10.43.0.30", "fd00:43::30"}
	ipName := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "byip"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "192.0.2.9"},
	}
	f := start(t, Config{}, dual, ipName)
	for _, tc := range []struct {
		name  string
		qtype uint16
		want  []string
	}{
		{"dual.default.svc.cluster.local.", dns.TypeA, []string{"dual.default.svc.cluster.local. 5 IN A 10.43.0.30"}},
		{"dual.default.svc.cluster.local.", dns.TypeAAAA, []string{"dual.default.svc.cluster.local. 5 IN AAAA fd00:43::30"}},
		{"0.3.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.3.4.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR,
			[]string{"0.3.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.3.4.0.0.0.0.d.f.ip6.arpa. 5 IN PTR dual.default.svc.cluster.local."}},
		{"byip.default.svc.cluster.local.", dns.TypeA, nil}, // an IP is no CNAME target: NODATA
	} {
		m := f.query(t, tc.name, tc.qtype)
		if got := texts(m.Answer); m.Rcode != dns.RcodeSuccess || !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: %s %q, want %q", tc.name, dns.TypeToString[tc.qtype], dns.RcodeToString[m.Rcode], got, tc.want)
		}
	}
	m := f.query(t, "_http._tcp.dual.default.svc.cluster.local.", dns.TypeSRV)
	if got := texts(m.Extra); len(got) != 2 {
		t.Errorf("SRV additional should carry both addresses: %q", got)
	}
}

// Until the caches synced, cluster names get SERVFAIL (not a cacheable
// NXDOMAIN) while forwarding already works.
func TestBeforeSync(t *testing.T) {
	up := defaultUpstream(t)
	c := fake.NewClientset()
	unblock := make(chan struct{})
	c.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-unblock
		return false, nil, nil
	})
	s, err := New(Config{Client: c, Domain: "cluster.local", Listen: []string{resolverIP + ":0"}, Upstreams: []string{up.addr},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	defer close(unblock)
	addr := s.Addrs()[0]
	// The socket is bound by New; Run starts reading it.
	poll.UntilNil(t, 5*time.Second, "forwarding before sync", func() error {
		if m := exchange(t, "udp", addr, "www.upstream.test.", dns.TypeA); len(m.Answer) != 1 {
			return fmt.Errorf("answer %v", m)
		}
		return nil
	})
	if m := exchange(t, "udp", addr, "kubernetes.default.svc.cluster.local.", dns.TypeA); m.Rcode != dns.RcodeServerFailure {
		t.Errorf("cluster name before sync: %s, want SERVFAIL", dns.RcodeToString[m.Rcode])
	}
	select {
	case <-s.Ready():
		t.Error("ready before the caches synced")
	default:
	}
}

func TestEnsureRBAC(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	for _, user := range []string{"system:node:a", "system:node:b", "system:node:a"} {
		if err := EnsureRBAC(ctx, c, user); err != nil {
			t.Fatal(err)
		}
	}
	role, err := c.RbacV1().ClusterRoles().Get(ctx, RoleName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(role.Rules) != 2 {
		t.Errorf("rules %v", role.Rules)
	}
	b, err := c.RbacV1().ClusterRoleBindings().Get(ctx, RoleName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range b.Subjects {
		names = append(names, s.Name)
	}
	if !slices.Equal(names, []string{"system:node:a", "system:node:b"}) || b.RoleRef.Name != RoleName {
		t.Errorf("binding %v %v", names, b.RoleRef)
	}

	// A role edited by hand is put back; a binding to another role is
	// replaced, keeping its subjects.
	role.Rules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"*"}}}
	if _, err := c.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.RoleRef.Name = "other"
	if _, err := c.RbacV1().ClusterRoleBindings().Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := EnsureRBAC(ctx, c, "system:node:c"); err != nil {
		t.Fatal(err)
	}
	role, _ = c.RbacV1().ClusterRoles().Get(ctx, RoleName, metav1.GetOptions{})
	b, _ = c.RbacV1().ClusterRoleBindings().Get(ctx, RoleName, metav1.GetOptions{})
	if len(role.Rules) != 2 || b.RoleRef.Name != RoleName || len(b.Subjects) != 3 {
		t.Errorf("not repaired: %v %v %v", role.Rules, b.RoleRef, b.Subjects)
	}
	if err := EnsureRBAC(ctx, c, ""); err == nil {
		t.Error("empty user accepted")
	}
}
