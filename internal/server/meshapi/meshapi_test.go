package meshapi

import (
	"context"
	"strings"
	"testing"
	"time"

	netv1 "github.com/k3sm-dev/k3sm/api/net/v1"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	schemavalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"sigs.k8s.io/yaml"
)

// compile builds the policy's validator as the apiserver's
// ValidatingAdmissionPolicy plugin does (its compilePolicy): the same
// compiler, environment, variables, match conditions and messages.
func compile(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy) validating.Validator {
	t.Helper()
	comp, err := cel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	vars := cel.OptionalVariableDeclarations{HasAuthorizer: true}
	var named []cel.NamedExpressionAccessor
	for _, v := range p.Spec.Variables {
		named = append(named, &validating.Variable{Name: v.Name, Expression: v.Expression})
	}
	comp.CompileAndStoreVariables(named, vars, environment.StoredExpressions)
	var match []cel.ExpressionAccessor
	for i := range p.Spec.MatchConditions {
		match = append(match, (*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i]))
	}
	matcher := matchconditions.NewMatcher(comp.CompileCondition(match, vars, environment.StoredExpressions), p.Spec.FailurePolicy, "policy", "validate", p.Name)
	var conds, msgs []cel.ExpressionAccessor
	for _, v := range p.Spec.Validations {
		conds = append(conds, &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason})
		var m cel.ExpressionAccessor
		if v.MessageExpression != "" {
			m = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
		msgs = append(msgs, m)
	}
	return validating.NewValidator(comp.CompileCondition(conds, vars, environment.StoredExpressions), matcher,
		comp.CompileCondition(nil, vars, environment.StoredExpressions),
		comp.CompileCondition(msgs, cel.OptionalVariableDeclarations{}, environment.StoredExpressions), p.Spec.FailurePolicy, nil)
}

// peer is a MeshPeer named name for node nodeName, as the apiserver hands
// it to admission (unstructured).
func peer(t *testing.T, name, nodeName string) *unstructured.Unstructured {
	t.Helper()
	u, err := netv1.ToUnstructured(&netv1.MeshPeer{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: netv1.MeshPeerSpec{NodeName: nodeName, PublicKey: "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=", Endpoint: "192.168.1.10:51820",
			PodCIDR: "10.42.1.0/24", AllowedIPs: []string{"10.42.1.0/24"}, MeshIP: "10.42.1.1", PersistentKeepalive: 25}})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// admit runs the policy on a request and returns the first denial's
// message ("" if admitted). An expression that fails to evaluate fails
// the test: with failurePolicy Fail it would deny for the wrong reason.
func admit(t *testing.T, v validating.Validator, op admission.Operation, subresource string, obj, old *unstructured.Unstructured, u user.Info) string {
	t.Helper()
	var o, oo runtime.Object
	name := ""
	if obj != nil {
		o, name = obj, obj.GetName()
	}
	if old != nil {
		oo, name = old, old.GetName()
	}
	attr := admission.NewAttributesRecord(o, oo, netv1.MeshPeerGVK, "", name, netv1.MeshPeerGVR, subresource, op, nil, false, u)
	va, err := admission.NewVersionedAttributes(attr, netv1.MeshPeerGVK, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := v.Validate(context.Background(), netv1.MeshPeerGVR, va, nil, nil, celconfig.RuntimeCELCostBudget, nil)
	for _, d := range res.Decisions {
		if d.Evaluation == validating.EvalError {
			t.Fatalf("policy failed to evaluate: %s", d.Message)
		}
		if d.Action == validating.ActionDeny {
			if d.Reason != metav1.StatusReasonForbidden {
				t.Errorf("reason %s, want Forbidden", d.Reason)
			}
			return d.Message
		}
	}
	return ""
}

func TestPolicy(t *testing.T) {
	v := compile(t, Policy())
	if err := v.CompileError(); err != nil {
		t.Fatal(err)
	}
	nodeA := &user.DefaultInfo{Name: "system:node:a", Groups: []string{"system:nodes", "system:authenticated"}}
	admin := &user.DefaultInfo{Name: "system:admin", Groups: []string{"system:masters", "system:authenticated"}}
	gc := &user.DefaultInfo{Name: "system:serviceaccount:kube-system:generic-garbage-collector", Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	nodeless := &user.DefaultInfo{Name: "a", Groups: []string{"system:nodes"}} // in the group, without the node prefix
	own, other, misnamed := peer(t, "a", "a"), peer(t, "b", "b"), peer(t, "a", "b")
	const deny = "a node may write only its own MeshPeer (system:node:<name> writes meshpeers/<name>)"
	for _, tc := range []struct {
		name     string
		op       admission.Operation
		sub      string
		obj, old *unstructured.Unstructured
		u        user.Info
		want     string // a part of the denial; "" admits
	}{
		{"node creates its own", admission.Create, "", own, nil, nodeA, ""},
		{"node updates its own", admission.Update, "", own, own, nodeA, ""},
		{"node updates its own status", admission.Update, "status", own, own, nodeA, ""},
		{"node deletes its own", admission.Delete, "", nil, own, nodeA, ""},

		{"node creates another's", admission.Create, "", other, nil, nodeA, deny + ": system:node:a may not CREATE meshpeers/b (spec.nodeName b)"},
		{"node updates another's", admission.Update, "", other, other, nodeA, deny},
		{"node updates another's status", admission.Update, "status", other, other, nodeA, deny},
		{"node deletes another's", admission.Delete, "", nil, other, nodeA, deny + ": system:node:a may not DELETE meshpeers/b"},
		{"node creates one named after it for another node", admission.Create, "", misnamed, nil, nodeA, deny},
		{"node takes over another's", admission.Update, "", own, misnamed, nodeA, "spec.nodeName may not change"},
		{"node gives its own away", admission.Update, "", misnamed, own, nodeA, deny},
		{"group member without a node name", admission.Create, "", own, nil, nodeless, deny},

		{"admin creates any", admission.Create, "", other, nil, admin, ""},
		{"admin updates any", admission.Update, "", misnamed, own, admin, ""},
		{"admin deletes any", admission.Delete, "", nil, other, admin, ""},
		{"garbage collector deletes", admission.Delete, "", nil, other, gc, ""},
		{"user without groups", admission.Create, "", other, nil, &user.DefaultInfo{Name: "someone"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := admit(t, v, tc.op, tc.sub, tc.obj, tc.old, tc.u)
			if tc.want == "" && got != "" {
				t.Fatalf("denied: %s", got)
			}
			if tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("got %q, want a denial with %q", got, tc.want)
			}
		})
	}
}

func TestPolicyMatches(t *testing.T) {
	rules := Policy().Spec.MatchConstraints.ResourceRules
	if len(rules) != 1 {
		t.Fatalf("rules %+v", rules)
	}
	r := rules[0]
	if strings.Join(r.APIGroups, ",") != "net.k3sm.io" || strings.Join(r.Resources, ",") != "meshpeers,meshpeers/status" ||
		len(r.Operations) != 3 {
		t.Errorf("rule %+v: want CREATE, UPDATE and DELETE of meshpeers and meshpeers/status in net.k3sm.io", r)
	}
	if *Policy().Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Error("failurePolicy is not Fail")
	}
}

// crdSchema resolves the MeshPeer kind to the CRD's schema for the type
// checker.
type crdSchema struct{ s *spec.Schema }

func (c crdSchema) ResolveSchema(gvk schema.GroupVersionKind) (*spec.Schema, error) {
	if gvk != netv1.MeshPeerGVK {
		return nil, nil
	}
	return c.s, nil
}

// The apiserver type-checks a policy against the CRD's schema and reports
// mistakes only as warnings in its status; here they fail.
func TestPolicyTypeChecks(t *testing.T) {
	var crd apiextv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(netv1.CRD, &crd); err != nil {
		t.Fatal(err)
	}
	var props apiextensions.JSONSchemaProps
	if err := apiextv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, &props, nil); err != nil {
		t.Fatal(err)
	}
	_, s, err := schemavalidation.NewSchemaValidator(&props)
	if err != nil {
		t.Fatal(err)
	}
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{netv1.SchemeGroupVersion})
	mapper.Add(netv1.MeshPeerGVK, meta.RESTScopeRoot)
	tc := &validating.TypeChecker{SchemaResolver: crdSchema{s}, RestMapper: mapper}
	if w := tc.Check(Policy()); len(w) != 0 {
		t.Errorf("type check: %v", w)
	}
}

func TestEnsurePolicy(t *testing.T) {
	c := fake.NewClientset()
	ctx := context.Background()
	for range 2 { // creates, then updates
		if err := EnsurePolicy(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	p, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, PolicyName, metav1.GetOptions{})
	if err != nil || len(p.Spec.Validations) != 2 {
		t.Fatalf("policy %+v: %v", p, err)
	}
	b, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, PolicyName, metav1.GetOptions{})
	if err != nil || b.Spec.PolicyName != PolicyName || len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Fatalf("binding %+v: %v", b, err)
	}
}

func fakeDynamic() *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{CRDGVR: "CustomResourceDefinitionList"})
}

// setConditions sets the CRD's status conditions, as the apiserver's CRD
// controllers do.
func setConditions(t *testing.T, dyn dynamic.Interface, conds ...map[string]any) {
	t.Helper()
	u, err := dyn.Resource(CRDGVR).Get(context.Background(), netv1.CRDName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cs []any
	for _, c := range conds {
		cs = append(cs, c)
	}
	if err := unstructured.SetNestedSlice(u.Object, cs, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(CRDGVR).UpdateStatus(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestEnsure(t *testing.T) {
	kube, dyn := fake.NewClientset(), fakeDynamic()
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- Ensure(ctx, kube, dyn) }()
	poll.UntilNil(t, 10*time.Second, "the CRD created", func() error {
		_, err := dyn.Resource(CRDGVR).Get(ctx, netv1.CRDName, metav1.GetOptions{})
		return err
	})
	// The policy was there before the CRD.
	if _, err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, PolicyName, metav1.GetOptions{}); err != nil {
		t.Fatalf("binding not there before the CRD: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Ensure returned before the CRD was established: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	setConditions(t, dyn, map[string]any{"type": "NamesAccepted", "status": "True"}, map[string]any{"type": "Established", "status": "True"})
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Ensure did not return once the CRD was established")
	}

	// Again (a restart, or an upgrade that changed the CRD): the spec is
	// replaced, the labels merged, the status kept.
	u, _ := dyn.Resource(CRDGVR).Get(ctx, netv1.CRDName, metav1.GetOptions{})
	_ = unstructured.SetNestedField(u.Object, "old", "spec", "group")
	u.SetLabels(map[string]string{"mine": "x"})
	if _, err := dyn.Resource(CRDGVR).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(ctx, kube, dyn); err != nil {
		t.Fatal(err)
	}
	u, _ = dyn.Resource(CRDGVR).Get(ctx, netv1.CRDName, metav1.GetOptions{})
	if g, _, _ := unstructured.NestedString(u.Object, "spec", "group"); g != netv1.GroupName {
		t.Errorf("spec.group %q after Ensure", g)
	}
	if l := u.GetLabels(); l["mine"] != "x" || l["app.kubernetes.io/managed-by"] != "k3sm" {
		t.Errorf("labels %v", l)
	}
}

func TestWaitEstablishedRefusedNames(t *testing.T) {
	dyn := fakeDynamic()
	ctx := context.Background()
	if err := EnsureCRD(ctx, dyn); err != nil {
		t.Fatal(err)
	}
	setConditions(t, dyn, map[string]any{"type": "NamesAccepted", "status": "False", "message": `"meshpeers" is already in use`})
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := WaitEstablished(wctx, dyn)
	if err == nil || !strings.Contains(err.Error(), "already in use") || wctx.Err() != nil {
		t.Fatalf("err %v, want the names' refusal at once", err)
	}
}
