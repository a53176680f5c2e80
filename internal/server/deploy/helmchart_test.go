package deploy

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestValuesSetOverridesValuesContent(t *testing.T) {
	hc := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"valuesContent": "greeting: hello\nnested: {a: 1, b: 2}\n",
		"set":           map[string]any{"greeting": "true", "nested.b": int64(3), "flag": true},
	}}}
	vals, err := values(hc)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"greeting": "true", "flag": true, "nested": map[string]any{"a": float64(1), "b": int64(3)}}
	if !reflect.DeepEqual(vals, want) {
		t.Fatalf("values %#v, want %#v", vals, want)
	}
}

func TestCRDParses(t *testing.T) {
	objs, err := Parse(HelmChartCRD())
	if err != nil || len(objs) != 1 || objs[0].GetName() != "helmcharts.helm.cattle.io" {
		t.Fatalf("CRD: %v %v", objs, err)
	}
}

func TestTargetNamespaceDefaultsToTheChartsOwn(t *testing.T) {
	hc := &unstructured.Unstructured{}
	hc.SetNamespace("kube-system")
	if got := targetNamespace(hc); got != "kube-system" {
		t.Fatal(got)
	}
	_ = unstructured.SetNestedField(hc.Object, "apps", "spec", "targetNamespace")
	if got := targetNamespace(hc); got != "apps" {
		t.Fatal(got)
	}
}
