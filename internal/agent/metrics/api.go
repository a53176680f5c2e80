package metrics

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	corev1listers "k8s.io/client-go/listers/core/v1"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// Group and version served.
const (
	Group        = "metrics.k8s.io"
	Version      = "v1beta1"
	GroupVersion = Group + "/" + Version
)

// API serves metrics.k8s.io/v1beta1 from this node's Store and, with
// Remote, the other nodes': discovery, and list/get of nodes and pods with
// label and field selectors. It does no authentication or authorization
// itself (see Handler).
type API struct {
	Store    *Store
	NodeName string
	// NodeLabels returns the Node's labels (for label selectors and the
	// NodeMetrics' metadata).
	NodeLabels func(ctx context.Context) map[string]string
	// Pods resolves a sampled pod to its API object (labels, and whether it
	// still exists); pods it does not know are not reported.
	Pods corev1listers.PodLister
	// Remote, when set, holds the other nodes' readings; their pods are
	// resolved through its Pods.
	Remote *Remote
	// MaxAge: readings older than this are not served (the runtime, or
	// another node, stopped answering); zero means no limit.
	MaxAge time.Duration
	Now    func() time.Time
}

// nodeReadings is one node's store as the API serves it.
type nodeReadings struct {
	name   string
	store  *Store
	labels func() map[string]string
	pods   corev1listers.PodLister
	// scraped is when another node last answered: its readings are as
	// fresh as that, their timestamps being by its clock, not ours. Zero
	// for this node, whose readings' timestamps tell.
	scraped time.Time
}

// nodes are the stores served: this node's and the others' (name's only,
// when set).
func (a *API) nodes(ctx context.Context, name string) []nodeReadings {
	var out []nodeReadings
	if name == "" || name == a.NodeName {
		out = append(out, nodeReadings{name: a.NodeName, store: a.Store, pods: a.Pods, labels: func() map[string]string {
			if a.NodeLabels == nil {
				return nil
			}
			return a.NodeLabels(ctx)
		}})
	}
	if a.Remote != nil {
		for _, r := range a.Remote.readings(name) {
			out = append(out, nodeReadings{name: r.name, store: r.store, pods: a.Remote.Pods, scraped: r.scraped,
				labels: func() map[string]string { return r.labels }})
		}
	}
	return out
}

var requestInfo = &request.RequestInfoFactory{APIPrefixes: sets.NewString("apis"), GrouplessAPIPrefixes: sets.NewString("api")}

func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/apis", "/apis/":
		writeJSON(w, http.StatusOK, &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{apiGroup()}})
		return
	case "/apis/" + Group, "/apis/" + Group + "/":
		g := apiGroup()
		g.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
		writeJSON(w, http.StatusOK, &g)
		return
	case "/apis/" + GroupVersion, "/apis/" + GroupVersion + "/":
		writeJSON(w, http.StatusOK, apiResources())
		return
	case "/openapi/v2":
		// An empty but valid document: the aggregator merges it quietly
		// (a 404 makes it log and retry forever). No schema is published.
		writeJSON(w, http.StatusOK, map[string]any{"swagger": "2.0", "info": map[string]string{"title": "k3sm metrics.k8s.io", "version": Version}, "paths": map[string]any{}})
		return
	case "/openapi/v3":
		writeJSON(w, http.StatusOK, map[string]any{"paths": map[string]any{}})
		return
	case "/healthz", "/livez", "/readyz":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok"))
		return
	}
	info, err := requestInfo.NewRequestInfo(r)
	if err != nil || !info.IsResourceRequest || info.APIGroup != Group || info.APIVersion != Version || info.Subresource != "" {
		writeStatus(w, apierrors.NewNotFound(schema.GroupResource{}, r.URL.Path))
		return
	}
	gr := schema.GroupResource{Group: Group, Resource: info.Resource}
	if info.Verb != "get" && info.Verb != "list" {
		writeStatus(w, apierrors.NewMethodNotSupported(gr, info.Verb))
		return
	}
	q := r.URL.Query()
	lsel, err := labels.Parse(q.Get("labelSelector"))
	if err != nil {
		writeStatus(w, apierrors.NewBadRequest("labelSelector: "+err.Error()))
		return
	}
	fsel, err := fields.ParseSelector(q.Get("fieldSelector"))
	if err != nil {
		writeStatus(w, apierrors.NewBadRequest("fieldSelector: "+err.Error()))
		return
	}
	switch info.Resource {
	case "nodes":
		if info.Namespace != "" {
			writeStatus(w, apierrors.NewNotFound(gr, info.Name))
			return
		}
		items := a.nodeMetrics(r.Context(), info.Name, lsel, fsel)
		if info.Verb == "get" {
			if len(items) == 0 {
				writeStatus(w, apierrors.NewNotFound(gr, info.Name))
				return
			}
			writeJSON(w, http.StatusOK, &items[0])
			return
		}
		writeJSON(w, http.StatusOK, &metricsv1beta1.NodeMetricsList{TypeMeta: metav1.TypeMeta{Kind: "NodeMetricsList", APIVersion: GroupVersion}, Items: items})
	case "pods":
		items := a.podMetrics(r.Context(), info.Namespace, info.Name, lsel, fsel)
		if info.Verb == "get" {
			if len(items) == 0 {
				writeStatus(w, apierrors.NewNotFound(gr, info.Name))
				return
			}
			writeJSON(w, http.StatusOK, &items[0])
			return
		}
		writeJSON(w, http.StatusOK, &metricsv1beta1.PodMetricsList{TypeMeta: metav1.TypeMeta{Kind: "PodMetricsList", APIVersion: GroupVersion}, Items: items})
	default:
		writeStatus(w, apierrors.NewNotFound(gr, info.Name))
	}
}

func (a *API) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *API) fresh(t time.Time) bool {
	return a.MaxAge == 0 || a.now().Sub(t) <= a.MaxAge
}

// freshAt: a reading taken at t on node n may be served.
func (a *API) freshAt(n nodeReadings, t time.Time) bool {
	if !n.scraped.IsZero() {
		t = n.scraped
	}
	return a.fresh(t)
}

func (a *API) nodeMetrics(ctx context.Context, name string, lsel labels.Selector, fsel fields.Selector) []metricsv1beta1.NodeMetrics {
	var items []metricsv1beta1.NodeMetrics
	for _, n := range a.nodes(ctx, name) {
		r, ok := n.store.NodeRate()
		if !ok || !a.freshAt(n, r.Timestamp) {
			continue
		}
		lbls := n.labels()
		if !lsel.Matches(labels.Set(lbls)) || !fsel.Matches(fields.Set{"metadata.name": n.name}) {
			continue
		}
		items = append(items, metricsv1beta1.NodeMetrics{
			TypeMeta:   metav1.TypeMeta{Kind: "NodeMetrics", APIVersion: GroupVersion},
			ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: lbls, CreationTimestamp: metav1.NewTime(a.now())},
			Timestamp:  metav1.NewTime(r.Timestamp),
			Window:     metav1.Duration{Duration: r.Window},
			Usage:      r.ResourceList(),
		})
	}
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	return items
}

func (a *API) podMetrics(ctx context.Context, ns, name string, lsel labels.Selector, fsel fields.Selector) []metricsv1beta1.PodMetrics {
	now := metav1.NewTime(a.now())
	var items []metricsv1beta1.PodMetrics
	for _, n := range a.nodes(ctx, "") {
		for _, pr := range n.store.PodRates() {
			if (ns != "" && pr.Namespace != ns) || (name != "" && pr.Name != name) || !a.freshAt(n, pr.Timestamp) {
				continue
			}
			var lbls map[string]string
			if n.pods != nil {
				pod, err := n.pods.Pods(pr.Namespace).Get(pr.Name)
				if err != nil || pod.UID != pr.UID || podDone(pod) {
					continue
				}
				lbls = pod.Labels
			}
			if !lsel.Matches(labels.Set(lbls)) || !fsel.Matches(fields.Set{"metadata.name": pr.Name, "metadata.namespace": pr.Namespace}) {
				continue
			}
			pm := metricsv1beta1.PodMetrics{
				TypeMeta:   metav1.TypeMeta{Kind: "PodMetrics", APIVersion: GroupVersion},
				ObjectMeta: metav1.ObjectMeta{Name: pr.Name, Namespace: pr.Namespace, Labels: lbls, CreationTimestamp: now},
				Timestamp:  metav1.NewTime(pr.Timestamp),
				Window:     metav1.Duration{Duration: pr.Window},
			}
			for _, c := range pr.Containers {
				pm.Containers = append(pm.Containers, metricsv1beta1.ContainerMetrics{Name: c.Name, Usage: c.ResourceList()})
			}
			items = append(items, pm)
		}
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].Namespace != items[j].Namespace {
			return items[i].Namespace < items[j].Namespace
		}
		return items[i].Name < items[j].Name
	})
	return items
}

func podDone(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func apiGroup() metav1.APIGroup {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: GroupVersion, Version: Version}
	return metav1.APIGroup{Name: Group, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv}
}

func apiResources() *metav1.APIResourceList {
	verbs := metav1.Verbs{"get", "list"}
	return &metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: GroupVersion,
		APIResources: []metav1.APIResource{
			{Name: "nodes", SingularName: "", Namespaced: false, Kind: "NodeMetrics", Verbs: verbs},
			{Name: "pods", SingularName: "", Namespaced: true, Kind: "PodMetrics", Verbs: verbs},
		},
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeStatus(w http.ResponseWriter, err *apierrors.StatusError) {
	st := err.Status()
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	writeJSON(w, int(st.Code), &st)
}

// cachedLabels returns a NodeLabels func that reads the Node at most once
// per ttl and keeps the last labels it saw when a read fails.
func cachedLabels(get func(ctx context.Context) (map[string]string, error), ttl time.Duration) func(ctx context.Context) map[string]string {
	var mu sync.Mutex
	var last map[string]string
	var at time.Time
	return func(ctx context.Context) map[string]string {
		mu.Lock()
		defer mu.Unlock()
		if at.IsZero() || time.Since(at) > ttl {
			if l, err := get(ctx); err == nil {
				last, at = l, time.Now()
			}
		}
		return last
	}
}
