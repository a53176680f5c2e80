package deploy

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmwire"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

//go:embed helmchart-crd.yaml
var helmChartCRD []byte

//go:embed helmchartconfig-crd.yaml
var helmChartConfigCRD []byte

// CRDs are the CRDs the server installs at start: HelmChart and
// HelmChartConfig.
func CRDs() []byte {
	return append(append(append([]byte(nil), helmChartCRD...), "\n---\n"...), helmChartConfigCRD...)
}

// HelmChartGVR is the HelmChart resource.
var HelmChartGVR = schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}

// HelmChartConfigGVR is the HelmChartConfig resource: values for the
// HelmChart of the same name and namespace, merged over its own.
var HelmChartConfigGVR = schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmchartconfigs"}

// Finalizer holds a HelmChart until its release is uninstalled.
const Finalizer = "helm.cattle.io/k3sm-uninstall"

// Fields of k3s's HelmChart that k3sm accepts and ignores: they drive k3s's
// helm Job, which k3sm does not run (helm runs in k3sm-helm, beside k3sm).
var ignoredFields = []string{"jobImage", "bootstrap", "helmVersion", "backOffLimit", "podSecurityContext", "securityContext"}

// Charts reconciles HelmCharts with helm releases. The controller runs in
// k3sm; each helm operation runs in the helper binary k3sm-helm.
type Charts struct {
	RC         *rest.Config
	Kubeconfig string // the file of RC's credentials, for k3sm-helm
	Exe        string // k3sm's executable: k3sm-helm is beside it
	Log        *slog.Logger
	Resync     time.Duration // how often every chart is checked again (its release may have been removed)

	dyn     dynamic.Interface
	kube    kubernetes.Interface // the Secrets and ConfigMaps a HelmChart names; its Events
	queue   workqueue.TypedRateLimitingInterface[string]
	store   cache.Indexer // HelmCharts
	configs cache.Store   // HelmChartConfigs
}

// Run watches HelmCharts until ctx ends.
func (c *Charts) Run(ctx context.Context) error {
	var err error
	if c.dyn, err = dynamic.NewForConfig(c.RC); err != nil {
		return err
	}
	if c.kube, err = kubernetes.NewForConfig(c.RC); err != nil {
		return err
	}
	if c.Resync <= 0 {
		c.Resync = 5 * time.Minute
	}
	if _, err := c.helper(); err != nil {
		// Not fatal: a cluster without HelmCharts never needs it, and each
		// HelmChart's status says the same.
		c.Log.Warn("HelmCharts cannot be installed", "err", err)
	}
	if err := c.waitServed(ctx); err != nil {
		return err
	}
	c.queue = workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](2*time.Second, 2*time.Minute))
	f := dynamicinformer.NewDynamicSharedInformerFactory(c.dyn, c.Resync)
	inf := f.ForResource(HelmChartGVR).Informer()
	enqueue := func(obj any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(k)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue}); err != nil {
		return err
	}
	c.store = inf.GetIndexer()
	// A HelmChartConfig is keyed like its HelmChart: its events reconcile it.
	cfgInf := f.ForResource(HelmChartConfigGVR).Informer()
	if _, err := cfgInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue}); err != nil {
		return err
	}
	c.configs = cfgInf.GetStore()
	secInf, err := c.secretInformer()
	if err != nil {
		return err
	}
	f.Start(ctx.Done())
	go secInf.Run(ctx.Done())
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced, cfgInf.HasSynced, secInf.HasSynced) {
		return ctx.Err()
	}
	for c.next(ctx) {
	}
	return nil
}

// waitServed waits until the API serves HelmCharts and HelmChartConfigs:
// the server applies their CRDs just before, and an informer started
// before a CRD is established fails its first list (an error in the log)
// and retries only after a back-off, delaying the first chart by ~1 s.
func (c *Charts) waitServed(ctx context.Context) error {
	for _, gvr := range []schema.GroupVersionResource{HelmChartGVR, HelmChartConfigGVR} {
		warned := false
		for {
			_, err := c.dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
			if err == nil {
				break
			}
			// Anything but "not served yet" is worth a line, once; the
			// controller keeps trying either way.
			if !apierrors.IsNotFound(err) && !warned {
				c.Log.Warn("waiting for the API to serve "+gvr.Resource, "err", err)
				warned = true
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// secretInformer watches the metadata of Secrets only (their data would
// hold every Secret of the cluster in memory): a new resourceVersion of a
// Secret a chart reads values from reconciles the chart, which reads the
// Secret afresh.
func (c *Charts) secretInformer() (cache.SharedIndexInformer, error) {
	mc, err := metadata.NewForConfig(c.RC)
	if err != nil {
		return nil, err
	}
	secrets := corev1.SchemeGroupVersion.WithResource("secrets")
	inf := metadatainformer.NewFilteredMetadataInformer(mc, secrets, metav1.NamespaceAll, 0, cache.Indexers{}, nil).Informer()
	// Only the name and resourceVersion are used: drop the rest.
	if err := inf.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			m.ManagedFields, m.Annotations, m.Labels, m.OwnerReferences = nil, nil, nil, nil
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}
	changed := func(obj any) {
		m, err := meta.Accessor(obj)
		if err != nil {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				if m, err = meta.Accessor(d.Obj); err != nil {
					return
				}
			} else {
				return
			}
		}
		c.secretChanged(m.GetNamespace(), m.GetName())
	}
	_, err = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: changed,
		UpdateFunc: func(o, n any) {
			om, err1 := meta.Accessor(o)
			nm, err2 := meta.Accessor(n)
			if err1 == nil && err2 == nil && om.GetResourceVersion() == nm.GetResourceVersion() {
				return
			}
			changed(n)
		},
		DeleteFunc: changed,
	})
	return inf, err
}

// secretChanged reconciles the charts of namespace ns whose valuesSecrets,
// or their HelmChartConfig's, name the Secret without ignoreUpdates.
func (c *Charts) secretChanged(ns, name string) {
	charts, err := c.store.ByIndex(cache.NamespaceIndex, ns)
	if err != nil {
		return
	}
	for _, obj := range charts {
		hc, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		names := valuesSecretNames(specOf(hc))
		if cfg := c.config(hc); cfg != nil {
			names = append(names, valuesSecretNames(specOf(cfg))...)
		}
		if slices.Contains(names, name) {
			c.Log.Debug("values Secret changed", "secret", ns+"/"+name, "helmchart", ns+"/"+hc.GetName())
			c.queue.Add(ns + "/" + hc.GetName())
		}
	}
}

// config is the HelmChartConfig of hc, or nil.
func (c *Charts) config(hc *unstructured.Unstructured) *unstructured.Unstructured {
	obj, exists, err := c.configs.GetByKey(hc.GetNamespace() + "/" + hc.GetName())
	if err != nil || !exists {
		return nil
	}
	u, _ := obj.(*unstructured.Unstructured)
	return u
}

func (c *Charts) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.sync(ctx, key); err != nil {
		c.Log.Warn("HelmChart failed; retrying", "helmchart", key, "err", err)
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

func (c *Charts) sync(ctx context.Context, key string) error {
	obj, exists, err := c.store.GetByKey(key)
	if err != nil || !exists {
		return err
	}
	hc := obj.(*unstructured.Unstructured).DeepCopy()
	target := targetNamespace(hc)
	name := hc.GetName()
	ri := c.dyn.Resource(HelmChartGVR).Namespace(hc.GetNamespace())
	if hc.GetDeletionTimestamp() != nil {
		if !slices.Contains(hc.GetFinalizers(), Finalizer) {
			return nil
		}
		if _, err := c.helm(ctx, &helmwire.Request{Op: helmwire.OpUninstall, Release: name, Namespace: target}); err != nil {
			return c.fail(ctx, hc, reason(err, "UninstallFailed"), err)
		}
		c.Log.Info("helm release uninstalled", "helmchart", key, "release", name, "namespace", target)
		hc.SetFinalizers(slices.DeleteFunc(hc.GetFinalizers(), func(s string) bool { return s == Finalizer }))
		_, err := ri.Update(ctx, hc, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if !slices.Contains(hc.GetFinalizers(), Finalizer) {
		hc.SetFinalizers(append(hc.GetFinalizers(), Finalizer))
		// The update comes back as an event that reconciles the release.
		_, err := ri.Update(ctx, hc, metav1.UpdateOptions{})
		return err
	}

	layers, err := valueLayers(ctx, kubeSecretGetter(c), hc, c.config(hc))
	if err != nil {
		return c.fail(ctx, hc, "InvalidValues", err)
	}
	set, _, _ := unstructured.NestedMap(hc.Object, "spec", "set")
	vals := mergeValues(layers)
	digest, err := valuesDigest(layers, hc)
	if err != nil {
		return c.fail(ctx, hc, "InvalidValues", err)
	}

	// Up to date: this generation with these values was applied and its
	// release is still there.
	observed, _, _ := unstructured.NestedInt64(hc.Object, "status", "observedGeneration")
	revision, _, _ := unstructured.NestedInt64(hc.Object, "status", "revision")
	applied, _, _ := unstructured.NestedString(hc.Object, "status", "valuesDigest")
	// Deployed before status.valuesDigest existed: the release's own
	// values tell whether it is current; record the digest then.
	legacy := applied == ""
	upToDate := observed == hc.GetGeneration() && revision > 0 && (applied == digest || legacy)
	if upToDate && !legacy {
		// The release's record is a Secret of helm's: read here, no
		// k3sm-helm process for a chart that is up to date (an error
		// leaves it to the helper, below).
		if cur, err := releaseCurrent(ctx, c.kube, target, name, revision); err == nil {
			if cur {
				return nil
			}
			upToDate = false
		}
	}
	if upToDate {
		rel, err := c.helm(ctx, &helmwire.Request{Op: helmwire.OpRelease, Release: name, Namespace: target,
			Values: vals, Set: set, CompareValues: legacy})
		switch {
		case err != nil && stageOf(err) != helmwire.StageRelease:
			return c.fail(ctx, hc, reason(err, "InvalidValues"), err)
		case err == nil && rel.Found && rel.Revision == int(revision) && rel.Deployed:
			if !legacy {
				return nil
			}
			if rel.SameValues {
				st, _, _ := unstructured.NestedMap(hc.Object, "status")
				st["valuesDigest"] = digest
				return c.setStatus(ctx, hc, st)
			}
		}
	}

	req := &helmwire.Request{Op: helmwire.OpDeploy, Release: name, Namespace: target, Values: vals, Set: set, Timeout: 5 * time.Minute}
	req.CreateNamespace, _, _ = unstructured.NestedBool(hc.Object, "spec", "createNamespace")
	if req.ChartContent, _, _ = unstructured.NestedString(hc.Object, "spec", "chartContent"); req.ChartContent == "" {
		if req.Source, err = readSource(ctx, c.kube, hc); err != nil {
			return c.fail(ctx, hc, "ChartNotLoaded", err)
		}
	}
	if s, _, _ := unstructured.NestedString(hc.Object, "spec", "timeout"); s != "" {
		if req.Timeout, err = time.ParseDuration(s); err != nil {
			return c.fail(ctx, hc, "InvalidTimeout", fmt.Errorf("spec.timeout %q: use a Go duration such as 5m", s))
		}
	}
	rel, err := c.helm(ctx, req)
	if err != nil {
		return c.fail(ctx, hc, reason(err, "InstallFailed"), err)
	}
	c.Log.Info("helm release deployed", "helmchart", key, "release", name, "namespace", target, "revision", rel.Revision, "chart", rel.ChartName+"-"+rel.ChartVersion)
	msg := fmt.Sprintf("release %s revision %d: chart %s-%s deployed", name, rel.Revision, rel.ChartName, rel.ChartVersion)
	if ign := ignored(hc); len(ign) > 0 {
		msg += "; ignored (k3s helm Job settings): " + strings.Join(ign, ", ")
	}
	return c.setStatus(ctx, hc, map[string]any{
		"observedGeneration": hc.GetGeneration(),
		"releaseName":        name,
		"targetNamespace":    target,
		"revision":           int64(rel.Revision),
		"chartVersion":       rel.ChartVersion,
		"valuesDigest":       digest,
		"conditions": []any{
			condition("Ready", "True", "Deployed", msg),
			condition("Failed", "False", "Deployed", ""),
		},
	})
}

// releaseCurrent reports whether release name in namespace is deployed at
// revision, from the records helm's Secret driver keeps (labels owner=helm,
// name, version, status; the helper's actions use that driver): what
// k3sm-helm's OpRelease answers, without starting it. An error leaves the
// question to the helper.
func releaseCurrent(ctx context.Context, kube kubernetes.Interface, namespace, name string, revision int64) (bool, error) {
	list, err := kube.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + name})
	if err != nil {
		return false, err
	}
	latest, status := int64(0), ""
	for _, s := range list.Items {
		v, err := strconv.ParseInt(s.Labels["version"], 10, 64)
		if err == nil && v > latest {
			latest, status = v, s.Labels["status"]
		}
	}
	return latest == revision && status == "deployed", nil
}

// reason is the status reason of a failed k3sm-helm call: by the stage
// that failed, as the in-process controller named them, or def.
func reason(err error, def string) string {
	switch stageOf(err) {
	case helmwire.StageValues:
		return "InvalidValues"
	case helmwire.StageChart:
		return "ChartNotLoaded"
	case helmwire.StageInstall:
		return "InstallFailed"
	case helmwire.StageUninstall:
		return "UninstallFailed"
	case "":
		return "HelperFailed"
	}
	return def
}

func targetNamespace(hc *unstructured.Unstructured) string {
	if ns, _, _ := unstructured.NestedString(hc.Object, "spec", "targetNamespace"); ns != "" {
		return ns
	}
	return hc.GetNamespace()
}

func ignored(hc *unstructured.Unstructured) []string {
	spec, _, _ := unstructured.NestedMap(hc.Object, "spec")
	var out []string
	for _, f := range ignoredFields {
		if _, ok := spec[f]; ok {
			out = append(out, "spec."+f)
		}
	}
	return out
}

func condition(typ, status, reason, msg string) map[string]any {
	return map[string]any{"type": typ, "status": status, "reason": reason, "message": msg,
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}
}

func (c *Charts) fail(ctx context.Context, hc *unstructured.Unstructured, reason string, err error) error {
	st, _, _ := unstructured.NestedMap(hc.Object, "status")
	if st == nil {
		st = map[string]any{}
	}
	// The same failure again leaves the status alone: an update would come
	// back as an event and retry at once, past the rate limiter.
	if conds, _, _ := unstructured.NestedSlice(st, "conditions"); len(conds) > 0 {
		if m, ok := conds[0].(map[string]any); ok && m["status"] == "False" && m["reason"] == reason && m["message"] == err.Error() {
			return err
		}
	}
	st["conditions"] = []any{condition("Ready", "False", reason, err.Error()), condition("Failed", "True", reason, err.Error())}
	if serr := c.setStatus(ctx, hc, st); serr != nil {
		c.Log.Debug("cannot update HelmChart status", "err", serr)
	}
	c.event(ctx, hc, reason, err.Error())
	return err
}

// event records a new failure on the HelmChart, where `kubectl describe
// helmchart` shows it.
func (c *Charts) event(ctx context.Context, hc *unstructured.Unstructured, reason, msg string) {
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: hc.GetName() + ".", Namespace: hc.GetNamespace()},
		InvolvedObject: corev1.ObjectReference{APIVersion: HelmChartGVR.GroupVersion().String(), Kind: "HelmChart",
			Name: hc.GetName(), Namespace: hc.GetNamespace(), UID: hc.GetUID(), ResourceVersion: hc.GetResourceVersion()},
		Reason: reason, Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "k3sm-helm-controller"},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := c.kube.CoreV1().Events(hc.GetNamespace()).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		c.Log.Debug("cannot record the HelmChart failure as an Event", "err", err)
	}
}

func (c *Charts) setStatus(ctx context.Context, hc *unstructured.Unstructured, st map[string]any) error {
	hc = hc.DeepCopy()
	if err := unstructured.SetNestedField(hc.Object, st, "status"); err != nil {
		return err
	}
	_, err := c.dyn.Resource(HelmChartGVR).Namespace(hc.GetNamespace()).UpdateStatus(ctx, hc, metav1.UpdateOptions{})
	return err
}
