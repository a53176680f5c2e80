package deploy

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestCRDsParse(t *testing.T) {
	objs, err := Parse(CRDs())
	if err != nil || len(objs) != 2 || objs[0].GetName() != "helmcharts.helm.cattle.io" || objs[1].GetName() != "helmchartconfigs.helm.cattle.io" {
		t.Fatalf("CRDs: %v %v", objs, err)
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
