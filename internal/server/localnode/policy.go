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

// osOfNodes is the kubernetes.io/os value pods must select: this machine's.
func osOfNodes() string { return goruntime.GOOS }

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
		"(and a toleration for the taint %s=%s:%s)", os, node.Taint.Key, node.Taint.Value, node.Taint.Effect)
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
