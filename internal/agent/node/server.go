package node

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/agent/localpath"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// Hidden roles of the k3sm binary for the node side.
const (
	RoleRuntime = "runtimed"
	RoleNode    = "node"
)

// Files of the server's own node under the data directory.
type Files struct{ Root string }

func (f Files) Dir() string           { return filepath.Join(f.Root, "agent") }
func (f Files) Kubeconfig() string    { return filepath.Join(f.Dir(), "node.kubeconfig") }
func (f Files) ServingCert() string   { return filepath.Join(f.Dir(), "tls", "serving-kubelet.crt") }
func (f Files) ServingKey() string    { return filepath.Join(f.Dir(), "tls", "serving-kubelet.key") }
func (f Files) ClientCA() string      { return filepath.Join(f.Dir(), "tls", "client-ca.crt") }
func (f Files) RuntimeSocket() string { return filepath.Join(f.Root, "run", "runtime.sock") }

// LocalPathKubeconfig is the node's local-path provisioner credential (its
// own user, bound to localpath.RoleName; never the node's or admin's).
func (f Files) LocalPathKubeconfig() string { return filepath.Join(f.Dir(), "local-path.kubeconfig") }

// StorageDir holds the local-path PersistentVolumes' directories.
func (f Files) StorageDir() string { return filepath.Join(f.Root, "storage") }

// localPathUser is the provisioner's user name for a node.
func localPathUser(node string) string { return "k3sm:local-path-provisioner:" + node }

// ServerAddon joins the server's own machine as a node: it issues the node's
// credentials and starts the runtime daemon early (they need only the data
// dir), lays down the OS-selector admission policy and starts the node once
// authorization is verified, and waits for the Node to be Ready.
//
// extraArgs add flags to the node's command line (e.g. metrics.ServerAddon's
// NodeArgs); they are called after every Early hook ran.
func ServerAddon(extraArgs ...func(*controlplane.Plane) []string) controlplane.Addon {
	var rt, n *supervisor.Child
	var admin kubernetes.Interface
	return controlplane.Addon{
		Early: func(ctx context.Context, p *controlplane.Plane, sup *supervisor.Supervisor) error {
			f := Files{p.Cfg.DataDir}
			if err := issueCredentials(p, f); err != nil {
				return fmt.Errorf("node credentials: %w", err)
			}
			if p.Cfg.NodeInstant {
				return nil
			}
			var err error
			rt, err = sup.Start(ctx, runtimeComponent{p, f})
			return err
		},
		Verified: func(ctx context.Context, p *controlplane.Plane, sup *supervisor.Supervisor) error {
			var err error
			if admin, err = adminClient(p); err != nil {
				return err
			}
			if err := EnsureOSPolicy(ctx, admin, osOfNodes()); err != nil {
				return fmt.Errorf("admission policy: %w", err)
			}
			if err := localpath.EnsureStorageClass(ctx, admin); err != nil {
				return fmt.Errorf("local-path storage class: %w", err)
			}
			if err := localpath.EnsureRBAC(ctx, admin, localPathUser(p.Cfg.NodeName)); err != nil {
				return fmt.Errorf("local-path provisioner RBAC: %w", err)
			}
			if rt != nil {
				wctx, cancel := context.WithTimeout(ctx, time.Minute)
				err := rt.WaitReady(wctx)
				cancel()
				if err != nil {
					return err
				}
			}
			var extra []string
			for _, f := range extraArgs {
				extra = append(extra, f(p)...)
			}
			n, err = sup.Start(ctx, nodeComponent{p, Files{p.Cfg.DataDir}, admin, extra})
			return err
		},
		Ready: func(ctx context.Context, p *controlplane.Plane, _ *supervisor.Supervisor) error {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			if err := n.WaitReady(wctx); err != nil {
				return err
			}
			// A node may not give itself a role label (NodeRestriction); the server does.
			patch := []byte(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":"true"}}}`)
			_, err := admin.CoreV1().Nodes().Patch(ctx, p.Cfg.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
			return err
		},
	}
}

func adminClient(p *controlplane.Plane) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", p.Layout.Cred("admin"))
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "k3sm-supervisor"
	rc.QPS, rc.Burst = 100, 200
	return kubernetes.NewForConfig(rc)
}

func issueCredentials(p *controlplane.Plane, f Files) error {
	cfg := p.Cfg
	tlsDir := filepath.Join(f.Dir(), "tls")
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		return err
	}
	client, err := p.Certs.ClientCA.Ensure(tlsDir, "client-kubelet", pki.LeafSpec{
		CommonName: "system:node:" + cfg.NodeName, Organization: []string{"system:nodes"}, Client: true})
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	ips := []net.IP{net.ParseIP("127.0.0.1")}
	if ip := net.ParseIP(cfg.NodeIP); ip != nil && !ip.Equal(ips[0]) {
		ips = append(ips, ip)
	}
	if _, err := p.Certs.ServerCA.Ensure(tlsDir, "serving-kubelet", pki.LeafSpec{
		CommonName: "system:node:" + cfg.NodeName, Organization: []string{"system:nodes"},
		DNSNames: uniq("localhost", cfg.NodeName, host), IPs: ips, Server: true}); err != nil {
		return err
	}
	if err := pki.WriteFile(f.ClientCA(), p.Certs.ClientCA.CertPEM()); err != nil {
		return err
	}
	if err := controlplane.WriteKubeconfig(f.Kubeconfig(), cfg.LocalAPIURL(), p.Certs.ServerCA.CertPEM(), client, "node"); err != nil {
		return err
	}
	lp, err := p.Certs.ClientCA.Ensure(tlsDir, "client-local-path", pki.LeafSpec{CommonName: localPathUser(cfg.NodeName), Client: true})
	if err != nil {
		return err
	}
	return controlplane.WriteKubeconfig(f.LocalPathKubeconfig(), cfg.LocalAPIURL(), p.Certs.ServerCA.CertPEM(), lp, "local-path")
}

func uniq(xs ...string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range xs {
		if x != "" && !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

type runtimeComponent struct {
	p *controlplane.Plane
	f Files
}

func (r runtimeComponent) Name() string { return "runtimed" }
func (r runtimeComponent) Command() supervisor.Command {
	return supervisor.Command{Path: r.p.Cfg.Executable, Dir: r.p.Cfg.DataDir, Args: append([]string{RoleRuntime,
		"--data-dir=" + r.p.Cfg.DataDir, "--socket=" + r.f.RuntimeSocket(), "--registries-config=" + r.p.Cfg.RegistriesConfig, "--max-pods=" + strconv.Itoa(r.p.Cfg.MaxPods)}, r.p.Cfg.Disk.RuntimeArgs()...)}
}
func (r runtimeComponent) Ready(ctx context.Context) error {
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", r.f.RuntimeSocket())
	if err != nil {
		return err
	}
	return c.Close()
}

type nodeComponent struct {
	p     *controlplane.Plane
	f     Files
	admin kubernetes.Interface
	extra []string
}

func (n nodeComponent) Name() string { return "node" }
func (n nodeComponent) Command() supervisor.Command {
	cfg := n.p.Cfg
	args := []string{RoleNode, "--node-name=" + cfg.NodeName, "--node-ip=" + cfg.NodeIP,
		"--kubelet-port=" + strconv.Itoa(cfg.KubeletPort), "--kubeconfig=" + n.f.Kubeconfig(),
		"--tls-cert-file=" + n.f.ServingCert(), "--tls-private-key-file=" + n.f.ServingKey(),
		"--client-ca-file=" + n.f.ClientCA(), "--runtime-socket=" + n.f.RuntimeSocket(), "--data-dir=" + cfg.DataDir,
		"--local-path-kubeconfig=" + n.f.LocalPathKubeconfig(), "--local-path-dir=" + n.f.StorageDir()}
	if cfg.NodeInstant {
		args = append(args, "--instant")
	}
	args = append(args, cfg.Disk.NodeArgs()...)
	args = append(args, n.extra...)
	return supervisor.Command{Path: cfg.Executable, Dir: cfg.DataDir, Args: args}
}

// Ready: the Node object exists and reports Ready.
func (n nodeComponent) Ready(ctx context.Context) error {
	node, err := n.admin.CoreV1().Nodes().Get(ctx, n.p.Cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("node %s is not Ready", node.Name)
}

// PolicyName is the ValidatingAdmissionPolicy that keeps pods which do not
// select this node's OS out of the cluster.
const PolicyName = "k3sm-pods-select-node-os"

// EnsureOSPolicy creates or updates the policy and its binding. A pod must
// select kubernetes.io/os=<os> with a nodeSelector or a required node
// affinity term; otherwise it is rejected with a message that says what to add.
func EnsureOSPolicy(ctx context.Context, c kubernetes.Interface, os string) error {
	selects := fmt.Sprintf(`(has(object.spec.nodeSelector) && 'kubernetes.io/os' in object.spec.nodeSelector && object.spec.nodeSelector['kubernetes.io/os'] == '%[1]s') ||
(has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) &&
 has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) &&
 object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.all(t,
   has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == 'kubernetes.io/os' && e.operator == 'In' && e.values.all(v, v == '%[1]s'))))`, os)
	msg := fmt.Sprintf("k3sm runs pods as native %[1]s processes: add `nodeSelector: {kubernetes.io/os: %[1]s}` to the pod spec "+
		"(and a toleration for the taint %s=%s:%s)", os, Taint.Key, Taint.Value, Taint.Effect)
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName, Labels: map[string]string{"app.kubernetes.io/managed-by": "k3sm"}},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: selects, Message: msg, Reason: ptr.To(metav1.StatusReasonInvalid)}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName, Labels: policy.Labels},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        PolicyName,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	pc := c.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	if have, err := pc.Get(ctx, PolicyName, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := pc.Create(ctx, policy, metav1.CreateOptions{}); err != nil {
			return err
		}
	} else if err != nil {
		return err
	} else {
		policy.ResourceVersion = have.ResourceVersion
		if _, err := pc.Update(ctx, policy, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	bc := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	if have, err := bc.Get(ctx, PolicyName, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		_, err = bc.Create(ctx, binding, metav1.CreateOptions{})
		return err
	} else if err != nil {
		return err
	} else {
		binding.ResourceVersion = have.ResourceVersion
		_, err = bc.Update(ctx, binding, metav1.UpdateOptions{})
		return err
	}
}
