package localnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"slices"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/agent/metrics"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestAPIServiceObject(t *testing.T) {
	as := APIService(43210, []byte("CA"))
	s := as.Spec
	if as.Name != "v1beta1.metrics.k8s.io" || s.Group != "metrics.k8s.io" || s.Version != "v1beta1" || s.Service == nil ||
		s.Service.Namespace != "kube-system" || s.Service.Name != MetricsServiceName || *s.Service.Port != 43210 ||
		string(s.CABundle) != "CA" || s.InsecureSkipTLSVerify || as.Labels[managedBy] != "k3sm" {
		t.Fatalf("%+v", as)
	}
	// The aggregator verifies the serving certificate against <svc>.<ns>.svc.
	if names := ServiceDNSNames("cluster.local"); !slices.Contains(names, "k3sm-metrics.kube-system.svc") {
		t.Fatalf("serving names %v", names)
	}
}

// The scraper's certificate is its own identity (no groups), from the
// client CA the kubelets accept; the CA it verifies them by is the one
// that signs their serving certificates.
func TestMetricsScraperCredential(t *testing.T) {
	cfg := controlplane.Defaults()
	cfg.DataDir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := controlplane.NewPlane(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := prepareMetricsAPI(p)
	if err != nil {
		t.Fatal(err)
	}
	sc := m.serveConfig(p)
	pair, err := tls.LoadX509KeyPair(sc.ScrapeCertFile, sc.ScrapeKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(pair.Certificate[0])
	roots := x509.NewCertPool()
	roots.AddCert(p.Certs.ClientCA.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("scraper certificate: %v", err)
	}
	if cert.Subject.CommonName != MetricsScraperUser || len(cert.Subject.Organization) != 0 {
		t.Errorf("scraper subject %v", cert.Subject)
	}
	if ca, err := os.ReadFile(sc.KubeletCAFile); err != nil || string(ca) != string(p.Certs.ServerCA.CertPEM()) {
		t.Errorf("kubelet CA %s: %v", sc.KubeletCAFile, err)
	}
}

func TestEnsureMetricsScraperRole(t *testing.T) {
	c := fake.NewClientset()
	ctx := context.Background()
	for range 2 { // idempotent
		if err := EnsureMetricsScraperRole(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	role, err := c.RbacV1().ClusterRoles().Get(ctx, MetricsScraperRole, metav1.GetOptions{})
	if err != nil || role.Labels[managedBy] != "k3sm" || len(role.Rules) != len(metrics.ScraperRules()) {
		t.Fatalf("role %+v %v", role, err)
	}
	grants := func(resource, verb string) bool {
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
				return true
			}
		}
		return false
	}
	for _, want := range [][2]string{{"nodes/metrics", "get"}, {"nodes/stats", "get"}, {"nodes", "list"}, {"nodes", "watch"}, {"nodes", "get"}, {"pods", "list"}, {"pods", "watch"}} {
		if !grants(want[0], want[1]) {
			t.Errorf("role does not grant %s %s: %+v", want[1], want[0], role.Rules)
		}
	}
	b, err := c.RbacV1().ClusterRoleBindings().Get(ctx, MetricsScraperRole, metav1.GetOptions{})
	if err != nil || b.RoleRef.Name != MetricsScraperRole || len(b.Subjects) != 1 || b.Subjects[0].Kind != "User" || b.Subjects[0].Name != MetricsScraperUser {
		t.Fatalf("binding %+v %v", b, err)
	}
}
