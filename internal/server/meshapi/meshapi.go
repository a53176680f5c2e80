// Package meshapi installs the cluster's side of the WireGuard mesh at
// server start: the MeshPeer CRD (api/net/v1) and the admission policy
// that lets a node write only its own MeshPeer. The nodes' RBAC for
// MeshPeers is the agent's (internal/agent/mesh.EnsureRBAC); the objects
// are the nodes' (internal/agent/mesh).
//
// It is a package of its own rather than part of localnode or join: the
// API serves every node (the server's own and the joined ones) whether or
// not the join endpoint is on, and it is cluster-wide, not this machine's.
package meshapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	netv1 "github.com/k3sm-dev/k3sm/api/net/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// PolicyName names the ValidatingAdmissionPolicy and its binding.
const PolicyName = "k3sm-meshpeer-own-node"

// NodesGroup is the group of every node's user; the policy checks only
// its members.
const NodesGroup = "system:nodes"

// Message is the policy's refusal when its message expression cannot be
// evaluated.
const Message = "a node may write only its own MeshPeer (system:node:<name> writes meshpeers/<name>)"

// EstablishTimeout bounds the wait for the CRD to be served.
const EstablishTimeout = time.Minute

// CRDGVR is the CustomResourceDefinition resource.
var CRDGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

var labels = map[string]string{"app.kubernetes.io/managed-by": "k3sm"}

// Ensure installs the policy (and its binding), then the CRD, and waits
// until the CRD is established: the policy comes first, so no MeshPeer is
// ever written before nodes are held to their own.
func Ensure(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface) error {
	if err := EnsurePolicy(ctx, kube); err != nil {
		return fmt.Errorf("MeshPeer admission policy: %w", err)
	}
	if err := EnsureCRD(ctx, dyn); err != nil {
		return fmt.Errorf("MeshPeer CRD: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, EstablishTimeout)
	defer cancel()
	if err := WaitEstablished(wctx, dyn); err != nil {
		return fmt.Errorf("MeshPeer CRD: %w", err)
	}
	return nil
}

// Policy is the admission policy for MeshPeers. For a request by a node
// (a user in NodesGroup) it allows a create, update (also of the status)
// or delete of a MeshPeer only when the MeshPeer is the node's own: named
// after the node whose user makes the request, and on update it was that
// node's before too. Other users (admins, the garbage collector) are not
// checked.
func Policy() *admissionregistrationv1.ValidatingAdmissionPolicy {
	forbidden := ptr.To(metav1.StatusReasonForbidden)
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName, Labels: labels},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{netv1.GroupName}, APIVersions: []string{netv1.Version},
						Resources: []string{netv1.Resource, netv1.Resource + "/status"}, Scope: ptr.To(admissionregistrationv1.ClusterScope)},
				},
			}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name:       "node-users",
				Expression: fmt.Sprintf(`has(request.userInfo.groups) && '%s' in request.userInfo.groups`, NodesGroup),
			}},
			// A delete has no object: the MeshPeer is the one deleted.
			Variables: []admissionregistrationv1.Variable{{
				Name:       "peer",
				Expression: `request.operation == 'DELETE' ? oldObject : object`,
			}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: `request.userInfo.username == 'system:node:' + variables.peer.spec.nodeName &&
 variables.peer.metadata.name == variables.peer.spec.nodeName`,
				Message: Message,
				MessageExpression: `'` + Message + `: ' + request.userInfo.username + ' may not ' + request.operation +
 ' meshpeers/' + variables.peer.metadata.name + ' (spec.nodeName ' + variables.peer.spec.nodeName + ')'`,
				Reason: forbidden,
			}, {
				Expression: `request.operation != 'UPDATE' || oldObject.spec.nodeName == object.spec.nodeName`,
				Message:    Message + ": spec.nodeName may not change",
				Reason:     forbidden,
			}},
		},
	}
}

// binding binds Policy to every request it matches, denying what it
// refuses.
func binding() *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName, Labels: labels},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        PolicyName,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
}

// EnsurePolicy creates or updates Policy and its binding (deny).
func EnsurePolicy(ctx context.Context, c kubernetes.Interface) error {
	policy, binding := Policy(), binding()
	pc := c.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := pc.Get(ctx, PolicyName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = pc.Create(ctx, policy, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(admissionregistrationv1.Resource("validatingadmissionpolicies"), PolicyName, err)
			}
			return err
		} else if err != nil {
			return err
		}
		policy.ResourceVersion = have.ResourceVersion
		_, err = pc.Update(ctx, policy, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	bc := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := bc.Get(ctx, PolicyName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = bc.Create(ctx, binding, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(admissionregistrationv1.Resource("validatingadmissionpolicybindings"), PolicyName, err)
			}
			return err
		} else if err != nil {
			return err
		}
		binding.ResourceVersion = have.ResourceVersion
		_, err = bc.Update(ctx, binding, metav1.UpdateOptions{})
		return err
	})
}

// CRD returns the MeshPeer CRD (netv1.CRD) as an object.
func CRD() (*unstructured.Unstructured, error) {
	var m map[string]any
	if err := yaml.Unmarshal(netv1.CRD, &m); err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	if u.GetName() != netv1.CRDName || u.GetKind() != "CustomResourceDefinition" {
		return nil, fmt.Errorf("embedded CRD is %s %q, want CustomResourceDefinition %q", u.GetKind(), u.GetName(), netv1.CRDName)
	}
	return u, nil
}

// EnsureCRD creates the CRD, or updates its spec and labels to this
// version's.
func EnsureCRD(ctx context.Context, dyn dynamic.Interface) error {
	want, err := CRD()
	if err != nil {
		return err
	}
	crds := dyn.Resource(CRDGVR)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := crds.Get(ctx, netv1.CRDName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = crds.Create(ctx, want, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(CRDGVR.GroupResource(), netv1.CRDName, err)
			}
			return err
		} else if err != nil {
			return err
		}
		upd := have.DeepCopy()
		upd.Object["spec"] = want.Object["spec"]
		l := upd.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		for k, v := range want.GetLabels() {
			l[k] = v
		}
		upd.SetLabels(l)
		_, err = crds.Update(ctx, upd, metav1.UpdateOptions{})
		return err
	})
}

// WaitEstablished waits until the CRD is Established, and fails at once
// when its names are refused (another CRD holds them).
func WaitEstablished(ctx context.Context, dyn dynamic.Interface) error {
	var last error
	for {
		u, err := dyn.Resource(CRDGVR).Get(ctx, netv1.CRDName, metav1.GetOptions{})
		if err == nil {
			established, refused, msg := conditions(u)
			if established {
				return nil
			}
			if refused {
				return fmt.Errorf("names not accepted: %s", msg)
			}
			last = errors.New("not established yet")
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the CRD to be established: %w (%v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// conditions reads a CRD's Established and NamesAccepted conditions.
func conditions(u *unstructured.Unstructured) (established, refused bool, msg string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok {
			continue
		}
		switch m["type"] {
		case "Established":
			established = established || m["status"] == "True"
		case "NamesAccepted":
			if m["status"] == "False" {
				refused = true
				msg, _ = m["message"].(string)
			}
		}
	}
	return established, refused, msg
}
