package deploy

import (
	"context"
	"log/slog"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
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

// The controller starts its informers only once both CRDs are served: a
// list answered "not found" (CRD not yet established) is tried again.
func TestWaitServed(t *testing.T) {
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		HelmChartGVR: "HelmChartList", HelmChartConfigGVR: "HelmChartConfigList"})
	lists := map[string]int{}
	dyn.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.GetResource().Resource
		lists[r]++
		if lists[r] <= 2 {
			return true, nil, apierrors.NewNotFound(a.GetResource().GroupResource(), "")
		}
		return false, nil, nil
	})
	c := &Charts{dyn: dyn, Log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.waitServed(ctx); err != nil {
		t.Fatal(err)
	}
	if lists["helmcharts"] != 3 || lists["helmchartconfigs"] != 3 {
		t.Fatalf("lists %v, want 3 of each (two not found, then served)", lists)
	}
	// Never served: it gives up with the context.
	lists = map[string]int{}
	dyn.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(a.GetResource().GroupResource(), "")
	})
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := c.waitServed(short); err == nil {
		t.Fatal("waitServed returned without the resources served")
	}
}
