package localnode

import (
	"slices"
	"testing"
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
