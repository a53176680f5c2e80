package localnode

import (
	"context"
	"fmt"
	goruntime "runtime"

	"github.com/k3sm-dev/k3sm/internal/agent/node"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// osOfNodes is this machine's OS: the kubernetes.io/os its node carries.
func osOfNodes() string { return goruntime.GOOS }

// PolicyName is the ValidatingAdmissionPolicy that keeps pods this node
// cannot run out of the cluster. The name predates the Linux rule (a pod
// that names no OS is accepted); it stays so an upgrade updates the policy
// in place instead of leaving the old one behind.
const PolicyName = "k3sm-pods-select-node-os"

// osValidations are the policy's rules for a node of the given OS.
// Kubernetes treats a pod that names no OS as a Linux pod, so on Linux only
// a pod that asks for another OS is refused: by spec.os.name, by a
// kubernetes.io/os nodeSelector, or by required node affinity none of whose
// terms can match. On any other OS a pod must also select that OS, because
// standard manifests assume Linux. tainted says whether the node carries the
// provider taint, which the message then mentions.
func osValidations(os string, tainted bool) []admissionregistrationv1.Validation {
	invalid := ptr.To(metav1.StatusReasonInvalid)
	osFix := "remove spec.os or set spec.os.name: " + os
	if os != "linux" {
		osFix = "remove spec.os (Kubernetes accepts only linux and windows there) and select kubernetes.io/os: " + os
	}
	const required = `has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) &&
 has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution)`
	const terms = `object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`
	// A term excludes this OS when one of its kubernetes.io/os expressions
	// cannot match the node's label (Gt and Lt compare integers, never an OS
	// name); the pod asks for another OS when every term does (terms are
	// ORed, a term's expressions ANDed).
	excludes := fmt.Sprintf(`has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == 'kubernetes.io/os' &&
   ((e.operator == 'In' && !(has(e.values) && '%[1]s' in e.values)) ||
    (e.operator == 'NotIn' && has(e.values) && '%[1]s' in e.values) ||
    e.operator in ['DoesNotExist', 'Gt', 'Lt']))`, os)
	vs := []admissionregistrationv1.Validation{{
		Expression: fmt.Sprintf(`!has(object.spec.os) || object.spec.os.name == '%s'`, os),
		Message:    fmt.Sprintf("spec.os.name names another OS, but k3sm runs this node's pods as native %s processes: %s", os, osFix),
		MessageExpression: fmt.Sprintf(`'spec.os.name is ' + object.spec.os.name + ', but k3sm runs this node\'s pods as native %s processes: %s'`,
			os, osFix),
		Reason: invalid,
	}, {
		Expression: fmt.Sprintf(`!has(object.spec.nodeSelector) || !('kubernetes.io/os' in object.spec.nodeSelector) ||
 object.spec.nodeSelector['kubernetes.io/os'] == '%s'`, os),
		Message: fmt.Sprintf("spec.nodeSelector['kubernetes.io/os'] names another OS, but k3sm runs this node's pods as native %[1]s processes: "+
			"remove it or set it to %[1]s", os),
		MessageExpression: fmt.Sprintf(`'spec.nodeSelector[\'kubernetes.io/os\'] is ' + object.spec.nodeSelector['kubernetes.io/os'] +
 ', but k3sm runs this node\'s pods as native %[1]s processes: remove it or set it to %[1]s'`, os),
		Reason: invalid,
	}, {
		Expression: fmt.Sprintf("!(%s &&\n %s.all(t, %s))", required, terms, excludes),
		Message: fmt.Sprintf("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution asks for a kubernetes.io/os other than %[1]s "+
			"in every term, but k3sm runs this node's pods as native %[1]s processes: let a term match kubernetes.io/os=%[1]s or remove the requirement", os),
		Reason: invalid,
	}}
	if os == "linux" {
		return vs
	}
	selects := fmt.Sprintf(`(has(object.spec.nodeSelector) && 'kubernetes.io/os' in object.spec.nodeSelector && object.spec.nodeSelector['kubernetes.io/os'] == '%[1]s') ||
(%[2]s &&
 %[3]s.all(t,
   has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == 'kubernetes.io/os' && e.operator == 'In' && e.values.all(v, v == '%[1]s'))))`,
		os, required, terms)
	msg := fmt.Sprintf("k3sm runs pods as native %[1]s processes, and a pod that selects no OS is a Linux pod: "+
		"add `nodeSelector: {kubernetes.io/os: %[1]s}` to the pod spec", os)
	if tainted {
		msg += fmt.Sprintf(" (and a toleration for the taint %s=%s:%s)", node.Taint.Key, node.Taint.Value, node.Taint.Effect)
	}
	return append(vs, admissionregistrationv1.Validation{Expression: selects, Message: msg, Reason: invalid})
}

// osPolicy is the policy for a node of the given OS: it checks pods as they
// are created.
func osPolicy(os string, tainted bool) *admissionregistrationv1.ValidatingAdmissionPolicy {
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName, Labels: map[string]string{"app.kubernetes.io/managed-by": "k3sm"}},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				},
			}}},
			Validations: osValidations(os, tainted),
		},
	}
}

// EnsureOSPolicy creates or updates the policy (osValidations says what it
// refuses) and its binding for a node of the given OS.
func EnsureOSPolicy(ctx context.Context, c kubernetes.Interface, os string, tainted bool) error {
	policy := osPolicy(os, tainted)
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
