package metrics

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregator "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/ptr"
)

// Names of what the server registers.
const (
	Namespace      = "kube-system"
	ServiceName    = "k3sm-metrics"
	APIServiceName = Version + "." + Group
	// ReaderRole lets view, edit and admin read metrics, as metrics-server's does.
	ReaderRole = "system:aggregated-metrics-reader"
	managedBy  = "app.kubernetes.io/managed-by"
)

// AddFlags registers the node role's flags for cfg.
func AddFlags(fs *flag.FlagSet, cfg *ServeConfig) {
	fs.StringVar(&cfg.Addr, "metrics-addr", "", "host:port to serve metrics.k8s.io on (empty: off)")
	fs.StringVar(&cfg.CertFile, "metrics-tls-cert-file", "", "metrics API serving certificate")
	fs.StringVar(&cfg.KeyFile, "metrics-tls-private-key-file", "", "metrics API serving key")
	fs.StringVar(&cfg.RequestHeaderCAFile, "requestheader-client-ca-file", "", "CA of the apiserver's front-proxy client certificate")
	fs.Func("requestheader-allowed-names", "common names the front-proxy certificate may have (comma-separated; empty: any)", func(s string) error {
		cfg.AllowedNames = nil
		for _, n := range strings.Split(s, ",") {
			if n = strings.TrimSpace(n); n != "" {
				cfg.AllowedNames = append(cfg.AllowedNames, n)
			}
		}
		return nil
	})
	fs.DurationVar(&cfg.Resolution, "metrics-resolution", DefaultResolution, "how often the node's usage is sampled")
}

// ServerAddon makes the server's own node serve metrics.k8s.io and
// registers it: a serving certificate and a loopback port for the node
// (Early), the reader ClusterRole and the Service (Verified), and the
// APIService once the node is Ready, so the aggregator's first
// availability check finds it listening.
type ServerAddon struct {
	port int
	cert pki.Leaf
	log  *slog.Logger
}

// NewServerAddon returns the addon; pass NodeArgs to node.ServerAddon.
func NewServerAddon(log *slog.Logger) *ServerAddon {
	if log == nil {
		log = slog.Default()
	}
	return &ServerAddon{log: log}
}

// NodeArgs are the node role's flags that turn the metrics API on.
func (a *ServerAddon) NodeArgs(p *controlplane.Plane) []string {
	if a.port == 0 {
		return nil
	}
	return a.args(p.Certs.RequestHeaderCA.CertPath, controlplane.AuthProxyUser)
}

func (a *ServerAddon) args(requestHeaderCA, proxyUser string) []string {
	return []string{"--metrics-addr=" + ListenAddr(a.port),
		"--metrics-tls-cert-file=" + a.cert.CertPath, "--metrics-tls-private-key-file=" + a.cert.KeyPath,
		"--requestheader-client-ca-file=" + requestHeaderCA, "--requestheader-allowed-names=" + proxyUser}
}

// Addon returns the hooks.
func (a *ServerAddon) Addon() controlplane.Addon {
	var admin kubernetes.Interface
	var agg aggregator.Interface
	return controlplane.Addon{
		Early: func(ctx context.Context, p *controlplane.Plane, _ *supervisor.Supervisor) error {
			if p.Cfg.NodeInstant { // benchmark floor: no runtime to sample
				return nil
			}
			dir := filepath.Join(p.Cfg.DataDir, "agent", "tls")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			var err error
			a.cert, err = p.Certs.ServerCA.Ensure(dir, "serving-metrics", pki.LeafSpec{
				CommonName: ServiceName, DNSNames: ServiceDNSNames(p.Cfg.ClusterDomain),
				IPs: []net.IP{net.ParseIP("127.0.0.1")}, Server: true})
			if err != nil {
				return fmt.Errorf("metrics serving certificate: %w", err)
			}
			a.port, err = freeLoopbackPort()
			return err
		},
		Verified: func(ctx context.Context, p *controlplane.Plane, _ *supervisor.Supervisor) error {
			if a.port == 0 {
				return nil
			}
			rc, err := clientcmd.BuildConfigFromFlags("", p.Layout.Cred("admin"))
			if err != nil {
				return err
			}
			rc.UserAgent = "k3sm-supervisor"
			rc.QPS, rc.Burst = 100, 200
			if admin, err = kubernetes.NewForConfig(rc); err != nil {
				return err
			}
			if agg, err = aggregator.NewForConfig(rc); err != nil {
				return err
			}
			if err := EnsureReaderRole(ctx, admin); err != nil {
				return fmt.Errorf("metrics reader role: %w", err)
			}
			if err := EnsureService(ctx, admin, a.port); err != nil {
				return fmt.Errorf("metrics service: %w", err)
			}
			return nil
		},
		Ready: func(ctx context.Context, p *controlplane.Plane, _ *supervisor.Supervisor) error {
			if a.port == 0 {
				return nil
			}
			err := EnsureAPIService(ctx, agg, a.port, p.Certs.ServerCA.CertPEM())
			if err == errNotOurs {
				a.log.Warn("not serving metrics.k8s.io: APIService " + APIServiceName + " exists and is not managed by k3sm (an installed metrics-server?); delete it to use k3sm's")
				return nil
			}
			return err
		},
	}
}

// ServiceDNSNames are the names the aggregator verifies the serving
// certificate against (<service>.<namespace>.svc).
func ServiceDNSNames(clusterDomain string) []string {
	svc := ServiceName + "." + Namespace + ".svc"
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

// EnsureReaderRole creates or updates the ClusterRole that aggregates
// metrics reading into view, edit and admin.
func EnsureReaderRole(ctx context.Context, c kubernetes.Interface) error {
	want := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: ReaderRole, Labels: map[string]string{
			managedBy: "k3sm",
			"rbac.authorization.k8s.io/aggregate-to-view":  "true",
			"rbac.authorization.k8s.io/aggregate-to-edit":  "true",
			"rbac.authorization.k8s.io/aggregate-to-admin": "true",
		}},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{Group}, Resources: []string{"pods", "nodes"}, Verbs: []string{"get", "list", "watch"}}},
	}
	cr := c.RbacV1().ClusterRoles()
	have, err := cr.Get(ctx, ReaderRole, metav1.GetOptions{})
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

// EnsureService points kube-system/k3sm-metrics at the node's loopback
// port. It is an ExternalName Service: the aggregator (without
// --enable-aggregator-routing and with no service proxy on the host) would
// otherwise dial a ClusterIP, and Endpoints may not name loopback addresses.
func EnsureService(ctx context.Context, c kubernetes.Interface, port int) error {
	want := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: ServiceName, Namespace: Namespace, Labels: ownLabels()},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeExternalName, ExternalName: "127.0.0.1",
			Ports: []corev1.ServicePort{{Name: "https", Port: int32(port), Protocol: corev1.ProtocolTCP}},
		},
	}
	sc := c.CoreV1().Services(Namespace)
	have, err := sc.Get(ctx, ServiceName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = sc.Create(ctx, want, metav1.CreateOptions{})
		return err
	} else if err != nil {
		return err
	}
	if have.Spec.Type != corev1.ServiceTypeExternalName {
		// Changing the type would need the cluster IP released; recreate.
		if err := sc.Delete(ctx, ServiceName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
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
			Service:              &apiregv1.ServiceReference{Namespace: Namespace, Name: ServiceName, Port: ptr.To(int32(port))},
			Group:                Group,
			Version:              Version,
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
