package localnode

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/client-go/kubernetes/scheme"
	generatedopenapi "k8s.io/kubernetes/pkg/generated/openapi"
)

// evalPolicy runs the policy's validations on pod as the apiserver's
// ValidatingAdmissionPolicy plugin does (the same compiler, environment and
// validator), and returns the message of the first denial, or "" if the pod
// is admitted.
func evalPolicy(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy, pod *corev1.Pod) string {
	t.Helper()
	comp, err := cel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	var conds, msgs []cel.ExpressionAccessor
	for _, v := range p.Spec.Validations {
		conds = append(conds, &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason})
		var m cel.ExpressionAccessor
		if v.MessageExpression != "" {
			m = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
		msgs = append(msgs, m)
	}
	vars := cel.OptionalVariableDeclarations{HasAuthorizer: true}
	val := validating.NewValidator(comp.CompileCondition(conds, vars, environment.StoredExpressions), nil,
		comp.CompileCondition(nil, vars, environment.StoredExpressions),
		comp.CompileCondition(msgs, cel.OptionalVariableDeclarations{}, environment.StoredExpressions), p.Spec.FailurePolicy, nil)
	gvk, gvr := corev1.SchemeGroupVersion.WithKind("Pod"), corev1.SchemeGroupVersion.WithResource("pods")
	attr := admission.NewAttributesRecord(pod, nil, gvk, "default", pod.Name, gvr, "", admission.Create, &metav1.CreateOptions{}, false, nil)
	res := val.Validate(context.Background(), gvr, &admission.VersionedAttributes{Attributes: attr, VersionedKind: gvk, VersionedObject: admission.NewLazyObject(pod)},
		nil, nil, celconfig.RuntimeCELCostBudget, nil)
	for _, d := range res.Decisions {
		if d.Evaluation == validating.EvalError {
			t.Fatalf("policy failed to evaluate on %s: %s", pod.Name, d.Message)
		}
		if d.Action == validating.ActionDeny {
			return d.Message
		}
	}
	return ""
}

func pod(name string, mut func(*corev1.PodSpec)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "example.test/web:1"}}}}
	if mut != nil {
		mut(&p.Spec)
	}
	return p
}

func osAffinity(terms ...corev1.NodeSelectorTerm) func(*corev1.PodSpec) {
	return func(s *corev1.PodSpec) {
		s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
	}
}

func osTerm(op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorTerm {
	return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelOSStable, Operator: op, Values: values}}}
}

func selector(os string) func(*corev1.PodSpec) {
	return func(s *corev1.PodSpec) { s.NodeSelector = map[string]string{corev1.LabelOSStable: os, "disk": "ssd"} }
}

func specOS(os corev1.OSName) func(*corev1.PodSpec) {
	return func(s *corev1.PodSpec) { s.OS = &corev1.PodOS{Name: os} }
}

func TestOSPolicyLinux(t *testing.T) {
	p := osPolicy("linux", false)
	for _, tc := range []struct {
		name string
		mut  func(*corev1.PodSpec)
		deny string // a part of the message; "" admits
	}{
		{"no OS at all", nil, ""},
		{"other node selectors", func(s *corev1.PodSpec) { s.NodeSelector = map[string]string{"disk": "ssd"} }, ""},
		{"linux selector", selector("linux"), ""},
		{"spec.os linux", specOS(corev1.Linux), ""},
		{"affinity In linux", osAffinity(osTerm(corev1.NodeSelectorOpIn, "linux", "windows")), ""},
		{"affinity NotIn windows", osAffinity(osTerm(corev1.NodeSelectorOpNotIn, "windows")), ""},
		{"affinity Exists", osAffinity(osTerm(corev1.NodeSelectorOpExists)), ""},
		{"affinity one term of two matches", osAffinity(osTerm(corev1.NodeSelectorOpIn, "windows"), osTerm(corev1.NodeSelectorOpIn, "linux")), ""},
		{"affinity on another label", osAffinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: "disk", Operator: corev1.NodeSelectorOpIn, Values: []string{"ssd"}}}}), ""},
		{"affinity by field", osAffinity(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n"}}}}), ""},

		{"windows selector", selector("windows"), "spec.nodeSelector['kubernetes.io/os'] is windows, but k3sm runs this node's pods as native linux processes: remove it or set it to linux"},
		{"spec.os windows", specOS(corev1.Windows), "spec.os.name is windows, but k3sm runs this node's pods as native linux processes: remove spec.os or set spec.os.name: linux"},
		{"affinity In windows", osAffinity(osTerm(corev1.NodeSelectorOpIn, "windows")), "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution asks for a kubernetes.io/os other than linux"},
		{"affinity NotIn linux", osAffinity(osTerm(corev1.NodeSelectorOpNotIn, "linux")), "requiredDuringSchedulingIgnoredDuringExecution"},
		{"affinity DoesNotExist", osAffinity(osTerm(corev1.NodeSelectorOpDoesNotExist)), "requiredDuringSchedulingIgnoredDuringExecution"},
		{"affinity no term matches", osAffinity(osTerm(corev1.NodeSelectorOpIn, "windows"), osTerm(corev1.NodeSelectorOpNotIn, "linux")), "requiredDuringSchedulingIgnoredDuringExecution"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := evalPolicy(t, p, pod("p", tc.mut))
			if tc.deny == "" && got != "" {
				t.Fatalf("denied: %s", got)
			}
			if tc.deny != "" && !strings.Contains(got, tc.deny) {
				t.Fatalf("got %q, want a denial with %q", got, tc.deny)
			}
		})
	}
}

func TestOSPolicyDarwin(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tainted bool
		mut     func(*corev1.PodSpec)
		deny    string
	}{
		{"darwin selector", true, selector("darwin"), ""},
		{"affinity In darwin", true, osAffinity(osTerm(corev1.NodeSelectorOpIn, "darwin")), ""},
		{"no OS is a Linux pod", true, nil, "add `nodeSelector: {kubernetes.io/os: darwin}` to the pod spec (and a toleration for the taint k3sm.io/provider=native:NoSchedule)"},
		{"no OS, untainted node", false, nil, "add `nodeSelector: {kubernetes.io/os: darwin}` to the pod spec"},
		{"linux selector", true, selector("linux"), "spec.nodeSelector['kubernetes.io/os'] is linux, but k3sm runs this node's pods as native darwin processes"},
		{"spec.os linux", true, func(s *corev1.PodSpec) { selector("darwin")(s); specOS(corev1.Linux)(s) }, "spec.os.name is linux"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := evalPolicy(t, osPolicy("darwin", tc.tainted), pod("p", tc.mut))
			if tc.deny == "" && got != "" {
				t.Fatalf("denied: %s", got)
			}
			if tc.deny != "" && !strings.Contains(got, tc.deny) {
				t.Fatalf("got %q, want a denial with %q", got, tc.deny)
			}
			if !tc.tainted && strings.Contains(got, "toleration") {
				t.Fatalf("an untainted node's message asks for a toleration: %s", got)
			}
		})
	}
}

// The apiserver type-checks a policy against the Pod schema and reports
// mistakes only as warnings in its status; here they fail.
func TestOSPolicyTypeChecks(t *testing.T) {
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{corev1.SchemeGroupVersion})
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Pod"), meta.RESTScopeNamespace)
	tc := &validating.TypeChecker{SchemaResolver: resolver.NewDefinitionsSchemaResolver(generatedopenapi.GetOpenAPIDefinitions, scheme.Scheme),
		RestMapper: mapper}
	for _, os := range []string{"linux", "darwin"} {
		if w := tc.Check(osPolicy(os, true)); len(w) != 0 {
			t.Errorf("%s policy: %v", os, w)
		}
	}
}
