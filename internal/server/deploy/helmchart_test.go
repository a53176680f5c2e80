package deploy

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
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

// releaseCurrent reads helm's release Secrets as OpRelease would answer.
func TestReleaseCurrent(t *testing.T) {
	rec := func(name, version, status string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "sh.helm.release.v1." + name + ".v" + version,
			Labels: map[string]string{"owner": "helm", "name": name, "version": version, "status": status}}}
	}
	kube := fake.NewClientset(rec("web", "1", "superseded"), rec("web", "2", "deployed"), rec("db", "3", "failed"),
		rec("other", "9", "deployed"))
	for _, c := range []struct {
		name string
		rev  int64
		want bool
	}{
		{"web", 2, true},   // the latest record, deployed
		{"web", 1, false},  // a later revision exists
		{"db", 3, false},   // failed
		{"gone", 1, false}, // no record: removed by hand
	} {
		got, err := releaseCurrent(context.Background(), kube, "apps", c.name, c.rev)
		if err != nil || got != c.want {
			t.Errorf("%s revision %d: %v %v, want %v", c.name, c.rev, got, err, c.want)
		}
	}
}
