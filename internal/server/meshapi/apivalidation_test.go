package meshapi

import (
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/kubernetes/pkg/apis/admissionregistration"
	admissionregistrationv1conv "k8s.io/kubernetes/pkg/apis/admissionregistration/v1"
	"k8s.io/kubernetes/pkg/apis/admissionregistration/validation"
)

// The apiserver's own validation of the policy and binding objects (after
// its defaulting): what would make EnsurePolicy fail at server start.
func TestPolicyIsValidAPIObject(t *testing.T) {
	p := Policy()
	admissionregistrationv1conv.SetObjectDefaults_ValidatingAdmissionPolicy(p)
	var ip admissionregistration.ValidatingAdmissionPolicy
	if err := admissionregistrationv1conv.Convert_v1_ValidatingAdmissionPolicy_To_admissionregistration_ValidatingAdmissionPolicy(p, &ip, nil); err != nil {
		t.Fatal(err)
	}
	if errs := validation.ValidateValidatingAdmissionPolicy(&ip); len(errs) > 0 {
		t.Errorf("the apiserver would refuse the policy: %v", errs.ToAggregate())
	}
	b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	b.Name = PolicyName
	b.Spec = binding().Spec
	admissionregistrationv1conv.SetObjectDefaults_ValidatingAdmissionPolicyBinding(b)
	var ib admissionregistration.ValidatingAdmissionPolicyBinding
	if err := admissionregistrationv1conv.Convert_v1_ValidatingAdmissionPolicyBinding_To_admissionregistration_ValidatingAdmissionPolicyBinding(b, &ib, nil); err != nil {
		t.Fatal(err)
	}
	if errs := validation.ValidateValidatingAdmissionPolicyBinding(&ib); len(errs) > 0 {
		t.Errorf("the apiserver would refuse the binding: %v", errs.ToAggregate())
	}
}
