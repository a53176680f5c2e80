package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// FieldManager owns the fields the manifests folder applies.
const FieldManager = "k3sm-deploy"

// DefaultNamespace is where a namespaced object that names no namespace
// goes, as in k3s (whose manifests are mostly kube-system add-ons).
const DefaultNamespace = metav1.NamespaceSystem

// How long an object of a kind the apiserver does not serve yet is retried:
// a CRD applied just before needs a moment to be established.
const noMatchWait = 15 * time.Second

// Applier server-side applies objects, finding their resources through a
// discovery cache that is refreshed when a kind is unknown (a CRD created by
// the same file).
type Applier struct {
	Dyn    dynamic.Interface
	Mapper *restmapper.DeferredDiscoveryRESTMapper
}

// NewApplier builds an Applier on rc.
func NewApplier(rc *rest.Config) (*Applier, error) {
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &Applier{Dyn: dyn, Mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// order applies namespaces and CRDs before what may live in them.
func order(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	rank := func(u *unstructured.Unstructured) int {
		switch u.GroupVersionKind().GroupKind().String() {
		case "Namespace":
			return 0
		case "CustomResourceDefinition.apiextensions.k8s.io":
			return 1
		}
		return 2
	}
	out := append([]*unstructured.Unstructured(nil), objs...)
	sort.SliceStable(out, func(i, j int) bool { return rank(out[i]) < rank(out[j]) })
	return out
}

// ApplyAll applies every object and returns one error per object that
// failed; the others are applied regardless.
func (a *Applier) ApplyAll(ctx context.Context, objs []*unstructured.Unstructured) error {
	var errs []error
	for _, u := range order(objs) {
		if err := a.Apply(ctx, u); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", u.GetKind(), describe(u), err))
		}
	}
	return errors.Join(errs...)
}

func describe(u *unstructured.Unstructured) string {
	if u.GetNamespace() != "" {
		return u.GetNamespace() + "/" + u.GetName()
	}
	return u.GetName()
}

// Apply server-side applies one object, forcing conflicts: the file is the
// source of truth for the fields it names, as with `kubectl apply
// --server-side --force-conflicts`.
func (a *Applier) Apply(ctx context.Context, u *unstructured.Unstructured) error {
	gvk := u.GroupVersionKind()
	var mapping *meta.RESTMapping
	deadline := time.Now().Add(noMatchWait)
	for {
		var err error
		mapping, err = a.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			break
		}
		if !meta.IsNoMatchError(err) || time.Now().After(deadline) {
			return err
		}
		a.Mapper.Reset()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	obj := u.DeepCopy()
	var ri dynamic.ResourceInterface = a.Dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(DefaultNamespace)
		}
		ri = a.Dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	} else {
		obj.SetNamespace("")
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	force := true
	_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: &force})
	return err
}
