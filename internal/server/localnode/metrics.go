package localnode

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/k3sm-dev/k3sm/internal/agent/agentrbac"
	"github.com/k3sm-dev/k3sm/internal/agent/metrics"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregator "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/ptr"
)

// What the server registers for the node's metrics.k8s.io API.
const (
	MetricsNamespace   = "kube-system"
	MetricsServiceName = "k3sm-metrics"
	APIServiceName     = metrics.Version + "." + metrics.Group
	// MetricsReaderRole lets view, edit and admin read metrics, as metrics-server's does.
	MetricsReaderRole = "system:aggregated-metrics-reader"
	// MetricsScraperUser is the identity the node's metrics API lists the
	// cluster's Nodes and pods and scrapes the other nodes' kubelets with:
	// a client certificate of its own, bound to MetricsScraperRole.
	MetricsScraperUser = "k3sm:metrics-scraper"
	MetricsScraperRole = "k3sm:metrics-scraper"
	managedBy          = "app.kubernetes.io/managed-by"
)

// metricsAPI is the node's metrics endpoint: a serving certificate, a
// loopback port chosen at start (port 0: off), and the scraper's client
// certificate.
type metricsAPI struct {
	port    int
	cert    pki.Leaf
	scraper pki.Leaf
}

func prepareMetricsAPI(p *controlplane.Plane) (metricsAPI, error) {
	var m metricsAPI
	dir := p.Layout.AgentTLSDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return m, err
	}
	var err error
	m.cert, err = p.Certs.ServerCA.Ensure(dir, "serving-metrics", pki.LeafSpec{
		CommonName: MetricsServiceName, DNSNames: ServiceDNSNames(p.Cfg.ClusterDomain),
		IPs: []net.IP{net.ParseIP("127.0.0.1")}, Server: true})
	if err != nil {
		return m, fmt.Errorf("metrics serving certificate: %w", err)
	}
	m.scraper, err = p.Certs.ClientCA.Ensure(dir, "client-metrics-scraper", pki.LeafSpec{CommonName: MetricsScraperUser, Client: true})
	if err != nil {
		return m, fmt.Errorf("metrics scraper certificate: %w", err)
	}
	m.port, err = freeLoopbackPort()
	return m, err
}

// serveConfig is the node's side of it: only the apiserver's front proxy
// may call. The other nodes' kubelets are verified as the apiserver
// verifies them (--kubelet-certificate-authority).
func (m metricsAPI) serveConfig(p *controlplane.Plane) roleconfig.MetricsAPI {
	if m.port == 0 {
		return roleconfig.MetricsAPI{}
	}
	return roleconfig.MetricsAPI{Addr: metrics.ListenAddr(m.port), CertFile: m.cert.CertPath, KeyFile: m.cert.KeyPath,
		RequestHeaderCAFile: p.Certs.RequestHeaderCA.CertPath, AllowedNames: []string{controlplane.AuthProxyUser},
		ScrapeCertFile: m.scraper.CertPath, ScrapeKeyFile: m.scraper.KeyPath, KubeletCAFile: p.Certs.ServerCA.CertPath}
}

// ServiceDNSNames are the names the aggregator verifies the serving
// certificate against (<service>.<namespace>.svc).
func ServiceDNSNames(clusterDomain string) []string {
	svc := MetricsServiceName + "." + MetricsNamespace + ".svc"
	names := []string{svc}
	if clusterDomain != "" {
		names = append(names, svc+"."+clusterDomain)
	}
	return names
}

func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("metrics port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func ownLabels() map[string]string { return map[string]string{managedBy: "k3sm"} }

// EnsureMetricsReaderRole creates or updates the ClusterRole that aggregates
// metrics reading into view, edit and admin.
func EnsureMetricsReaderRole(ctx context.Context, c kubernetes.Interface) error {
	want := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: MetricsReaderRole, Labels: map[string]string{
			managedBy: "k3sm",
			"rbac.authorization.k8s.io/aggregate-to-view":  "true",
			"rbac.authorization.k8s.io/aggregate-to-edit":  "true",
			"rbac.authorization.k8s.io/aggregate-to-admin": "true",
		}},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{metrics.Group}, Resources: []string{"pods", "nodes"}, Verbs: []string{"get", "list", "watch"}}},
	}
	cr := c.RbacV1().ClusterRoles()
	have, err := cr.Get(ctx, MetricsReaderRole, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cr.Create(ctx, want, metav1.CreateOptions{})
		return err
	} else if err != nil {
		return err
	}
	want.ResourceVersion = have.ResourceVersion
	_, err = cr.Update(ctx, want, metav1.UpdateOptions{})
	return err
}

// EnsureMetricsScraperRole creates or updates the ClusterRole
// MetricsScraperRole (what metrics-server's RBAC grants it) and binds it to
// MetricsScraperUser in the ClusterRoleBinding of the same name.
func EnsureMetricsScraperRole(ctx context.Context, c kubernetes.Interface) error {
	return agentrbac.Ensure(ctx, c, MetricsScraperRole, metrics.ScraperRules(), MetricsScraperUser)
}

// EnsureMetricsService points kube-system/k3sm-metrics at the node's loopback
// port. It is an ExternalName Service: the aggregator (without
// --enable-aggregator-routing and with no service proxy on the host) would
// otherwise dial a ClusterIP, and Endpoints may not name loopback addresses.
func EnsureMetricsService(ctx context.Context, c kubernetes.Interface, port int) error {
	want := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: MetricsServiceName, Namespace: MetricsNamespace, Labels: ownLabels()},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeExternalName, ExternalName: "127.0.0.1",
			Ports: []corev1.ServicePort{{Name: "https", Port: int32(port), Protocol: corev1.ProtocolTCP}},
		},
	}
	sc := c.CoreV1().Services(MetricsNamespace)
	have, err := sc.Get(ctx, MetricsServiceName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = sc.Create(ctx, want, metav1.CreateOptions{})
		return err
	} else if err != nil {
		return err
	}
	if have.Spec.Type != corev1.ServiceTypeExternalName {
		// Changing the type would need the cluster IP released; recreate.
		if err := sc.Delete(ctx, MetricsServiceName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		_, err = sc.Create(ctx, want, metav1.CreateOptions{})
		return err
	}
	want.ResourceVersion = have.ResourceVersion
	_, err = sc.Update(ctx, want, metav1.UpdateOptions{})
	return err
}

var errNotOurs = fmt.Errorf("APIService %s is not managed by k3sm", APIServiceName)

// APIService is the registration of metrics.k8s.io/v1beta1 with the node's
// port and the CA that signed its serving certificate.
func APIService(port int, caBundle []byte) *apiregv1.APIService {
	return &apiregv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: APIServiceName, Labels: ownLabels()},
		Spec: apiregv1.APIServiceSpec{
			Service:              &apiregv1.ServiceReference{Namespace: MetricsNamespace, Name: MetricsServiceName, Port: ptr.To(int32(port))},
			Group:                metrics.Group,
			Version:              metrics.Version,
			CABundle:             caBundle,
			GroupPriorityMinimum: 100,
			VersionPriority:      100,
		},
	}
}

// EnsureAPIService creates or updates the APIService; one that k3sm did
// not create (an installed metrics-server) is left alone (errNotOurs).
func EnsureAPIService(ctx context.Context, c aggregator.Interface, port int, caBundle []byte) error {
	want := APIService(port, caBundle)
	ac := c.ApiregistrationV1().APIServices()
	var err error
	for range 5 { // the aggregator's own controllers may update it meanwhile
		var have *apiregv1.APIService
		have, err = ac.Get(ctx, APIServiceName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = ac.Create(ctx, want, metav1.CreateOptions{})
		} else if err == nil {
			if have.Labels[managedBy] != "k3sm" {
				return errNotOurs
			}
			want.ResourceVersion = have.ResourceVersion
			_, err = ac.Update(ctx, want, metav1.UpdateOptions{})
		}
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
