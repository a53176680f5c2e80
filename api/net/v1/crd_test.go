package v1

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	schemavalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// crdValidator checks objects as the apiserver does on create: the schema
// (types, patterns, required fields) and the x-kubernetes-validations.
type crdValidator struct {
	s      *structuralschema.Structural
	schema schemavalidation.SchemaValidator
	cel    *cel.Validator
}

func loadCRD(t *testing.T) (*apiextv1.CustomResourceDefinition, *crdValidator) {
	t.Helper()
	var crd apiextv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(CRD, &crd); err != nil {
		t.Fatal(err)
	}
	var internal apiextensions.CustomResourceDefinition
	if err := apiextv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&crd, &internal, nil); err != nil {
		t.Fatal(err)
	}
	internal.Status.StoredVersions = []string{Version}
	// What the apiserver checks when the CRD is created: the structural
	// schema, defaults, and that every CEL rule compiles within its cost.
	if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), &internal); len(errs) > 0 {
		t.Fatalf("the apiserver would refuse the CRD:\n%v", errs.ToAggregate())
	}
	// The conversion moves a schema every version shares to spec.validation.
	val := internal.Spec.Validation
	if val == nil {
		val = internal.Spec.Versions[0].Schema
	}
	props := val.OpenAPIV3Schema
	s, err := structuralschema.NewStructural(props)
	if err != nil {
		t.Fatal(err)
	}
	sv, _, err := schemavalidation.NewSchemaValidator(props)
	if err != nil {
		t.Fatal(err)
	}
	return &crd, &crdValidator{s: s, schema: sv, cel: cel.NewValidator(s, true, celconfig.PerCallLimit)}
}

// validate defaults and checks obj as the apiserver would on create.
func (v *crdValidator) validate(obj map[string]any) field.ErrorList {
	structuraldefaulting.Default(obj, v.s)
	errs := schemavalidation.ValidateCustomResource(nil, obj, v.schema)
	celErrs, _ := v.cel.Validate(context.Background(), nil, v.s, obj, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...)
}

func TestCRDNames(t *testing.T) {
	crd, _ := loadCRD(t)
	if crd.Name != CRDName || crd.Spec.Group != GroupName || crd.Spec.Names.Kind != Kind || crd.Spec.Names.ListKind != ListKind ||
		crd.Spec.Names.Plural != Resource || crd.Spec.Scope != apiextv1.ClusterScoped {
		t.Errorf("CRD names %s %+v scope %s do not match the package's constants", crd.Name, crd.Spec.Names, crd.Spec.Scope)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != Version || !crd.Spec.Versions[0].Storage ||
		crd.Spec.Versions[0].Subresources == nil || crd.Spec.Versions[0].Subresources.Status == nil {
		t.Errorf("versions %+v: want v1, served and stored, with a status subresource", crd.Spec.Versions)
	}
	var cols []string
	for _, c := range crd.Spec.Versions[0].AdditionalPrinterColumns {
		cols = append(cols, strings.ToUpper(c.Name))
	}
	if want := []string{"NODE", "ENDPOINT", "POD-CIDR", "REACHABLE", "AGE"}; !reflect.DeepEqual(cols, want) {
		t.Errorf("printer columns %v, want %v", cols, want)
	}
}

// TestCRDMatchesTypes: every field of the Go types is in the schema (the
// apiserver prunes what is not), and a full object passes.
func TestCRDMatchesTypes(t *testing.T) {
	_, v := loadCRD(t)
	hs := metav1.Now()
	p := validPeer()
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "node-a", UID: "n1"}}
	p.Status = MeshPeerStatus{LastHandshakeTime: &hs, Reachable: true, Peers: []PeerStatus{{NodeName: "node-b", LastHandshakeTime: &hs, Reachable: true}}}
	u, err := ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	pruned := runtime.DeepCopyJSON(u.Object)
	structuralpruning.PruneWithOptions(pruned, v.s, true, structuralschema.UnknownFieldPathOptions{})
	if !reflect.DeepEqual(pruned, u.Object) {
		t.Errorf("the schema prunes fields of the Go types:\n got %v\nwant %v", pruned, u.Object)
	}
	if errs := v.validate(u.Object); len(errs) > 0 {
		t.Errorf("a valid MeshPeer is refused: %v", errs.ToAggregate())
	}
}

// TestCRDRefusesWhatValidateRefuses runs the cases of TestValidate through
// the CRD's schema.
func TestCRDRefusesWhatValidateRefuses(t *testing.T) {
	_, v := loadCRD(t)
	for _, tc := range validSpecs {
		p := validPeer()
		tc.mutate(p)
		u, err := ToUnstructured(p)
		if err != nil {
			t.Fatal(err)
		}
		if errs := v.validate(u.Object); len(errs) > 0 {
			t.Errorf("%s: refused: %v", tc.name, errs.ToAggregate())
		}
	}
	for _, tc := range invalidSpecs {
		p := validPeer()
		tc.mutate(p)
		u, err := ToUnstructured(p)
		if err != nil {
			t.Fatal(err)
		}
		errs := v.validate(u.Object)
		switch {
		case tc.crd && len(errs) == 0:
			t.Errorf("%s: accepted", tc.name)
		case !tc.crd && len(errs) > 0:
			t.Errorf("%s: refused (the test says the CRD cannot tell): %v", tc.name, errs.ToAggregate())
		case tc.crd && !strings.Contains(errs.ToAggregate().Error(), tc.want):
			t.Errorf("%s: errors %v do not name %s", tc.name, errs.ToAggregate(), tc.want)
		}
	}
	// The keepalive defaults to 25 when it is left out.
	u, _ := ToUnstructured(validPeer())
	delete(u.Object["spec"].(map[string]any), "persistentKeepalive")
	if errs := v.validate(u.Object); len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	if got := u.Object["spec"].(map[string]any)["persistentKeepalive"]; got != int64(25) {
		t.Errorf("persistentKeepalive defaulted to %v (%T), want 25", got, got)
	}
}
