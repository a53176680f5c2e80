package metrics

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"
)

// apiServer serves an API over a store with two readings of pods a
// (app=web, 2 containers), b (app=db) and c (sampled but gone from the API).
func apiServer(t *testing.T) (*httptest.Server, *metricsclient.Clientset) {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, p := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "uid-a", Labels: map[string]string{"app": "web"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "b", UID: "uid-b", Labels: map[string]string{"app": "db"}}},
	} {
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	store := NewStore()
	mk := func(s int, cpu uint64) *Sample {
		return &Sample{NodeOK: true, Node: Usage{Time: at(s), CPUNanos: 10 * cpu, MemoryWorkingSet: 3 << 30}, Pods: []PodSample{
			{Namespace: "ns", Name: "a", UID: "uid-a", Containers: []ContainerSample{ctr("web", s, cpu), ctr("log", s, cpu/2)}},
			{Namespace: "other", Name: "b", UID: "uid-b", Containers: []ContainerSample{ctr("db", s, 2*cpu)}},
			{Namespace: "ns", Name: "c", UID: "uid-c", Containers: []ContainerSample{ctr("x", s, cpu)}},
		}}
	}
	store.Add(mk(0, 1e9))
	store.Add(mk(10, 6e9)) // web: 0.5 core, log: 0.25, db: 1, node: 5
	api := &API{Store: store, NodeName: "n1", Pods: corev1listers.NewPodLister(idx), MaxAge: time.Minute,
		Now:        func() time.Time { return at(20) },
		NodeLabels: func(context.Context) map[string]string { return map[string]string{"kubernetes.io/os": "linux"} }}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	c, err := metricsclient.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func TestAPIPodsThroughClient(t *testing.T) {
	_, c := apiServer(t)
	ctx := context.Background()
	all, err := c.MetricsV1beta1().PodMetricses("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != 2 || all.Items[0].Name != "a" || all.Items[1].Name != "b" {
		t.Fatalf("all pods: %+v (c is not in the API and must be left out)", all.Items)
	}
	a := all.Items[0]
	if a.Labels["app"] != "web" || !a.Timestamp.Time.Equal(at(10)) || a.Window.Duration != 10*time.Second || len(a.Containers) != 2 {
		t.Fatalf("pod a: %+v", a)
	}
	if cpu := a.Containers[0].Usage[corev1.ResourceCPU]; a.Containers[0].Name != "web" || cpu.MilliValue() != 500 {
		t.Fatalf("web container: %+v", a.Containers[0])
	}
	ns, err := c.MetricsV1beta1().PodMetricses("ns").List(ctx, metav1.ListOptions{})
	if err != nil || len(ns.Items) != 1 || ns.Items[0].Name != "a" {
		t.Fatalf("namespace ns: %+v %v", ns, err)
	}
	sel, err := c.MetricsV1beta1().PodMetricses("").List(ctx, metav1.ListOptions{LabelSelector: "app in (db)"})
	if err != nil || len(sel.Items) != 1 || sel.Items[0].Name != "b" {
		t.Fatalf("label selector: %+v %v", sel, err)
	}
	fs, err := c.MetricsV1beta1().PodMetricses("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.namespace=other"})
	if err != nil || len(fs.Items) != 1 || fs.Items[0].Name != "b" {
		t.Fatalf("field selector: %+v %v", fs, err)
	}
	b, err := c.MetricsV1beta1().PodMetricses("other").Get(ctx, "b", metav1.GetOptions{})
	if err != nil || b.Containers[0].Usage.Cpu().MilliValue() != 1000 {
		t.Fatalf("get b: %+v %v", b, err)
	}
	if _, err := c.MetricsV1beta1().PodMetricses("ns").Get(ctx, "b", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get b in the wrong namespace: %v", err)
	}
	if _, err := c.MetricsV1beta1().PodMetricses("").List(ctx, metav1.ListOptions{LabelSelector: "app in (("}); !apierrors.IsBadRequest(err) {
		t.Fatalf("bad selector: %v", err)
	}
}

func TestAPINodesThroughClient(t *testing.T) {
	_, c := apiServer(t)
	ctx := context.Background()
	l, err := c.MetricsV1beta1().NodeMetricses().List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/os=linux"})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("nodes: %+v %v", l, err)
	}
	n := l.Items[0]
	if n.Name != "n1" || n.Usage.Cpu().Value() != 5 || n.Usage.Memory().Value() != 3<<30 || n.Window.Duration != 10*time.Second {
		t.Fatalf("node: %+v", n)
	}
	if l, err := c.MetricsV1beta1().NodeMetricses().List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/os=darwin"}); err != nil || len(l.Items) != 0 {
		t.Fatalf("selector that does not match: %+v %v", l, err)
	}
	if _, err := c.MetricsV1beta1().NodeMetricses().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.MetricsV1beta1().NodeMetricses().Get(ctx, "n2", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("other node: %v", err)
	}
}

func TestAPIStaleReadingsAreNotServed(t *testing.T) {
	srv, c := apiServer(t)
	api := srv.Config.Handler.(*API)
	api.Now = func() time.Time { return at(10).Add(2 * time.Minute) }
	l, err := c.MetricsV1beta1().PodMetricses("").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(l.Items) != 0 {
		t.Fatalf("stale pods served: %+v %v", l, err)
	}
	if _, err := c.MetricsV1beta1().NodeMetricses().Get(context.Background(), "n1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("stale node served: %v", err)
	}
}

func TestAPIDiscovery(t *testing.T) {
	srv, _ := apiServer(t)
	get := func(path string, into any) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s: %s %s", path, resp.Status, body)
		}
		if err := json.Unmarshal(body, into); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	var groups metav1.APIGroupList
	get("/apis", &groups)
	if len(groups.Groups) != 1 || groups.Groups[0].PreferredVersion.GroupVersion != "metrics.k8s.io/v1beta1" {
		t.Fatalf("/apis: %+v", groups)
	}
	var res metav1.APIResourceList
	get("/apis/metrics.k8s.io/v1beta1", &res)
	if res.Kind != "APIResourceList" || len(res.APIResources) != 2 || res.APIResources[1].Kind != "PodMetrics" || !res.APIResources[1].Namespaced {
		t.Fatalf("resources: %+v", res)
	}
	resp, err := http.Get(srv.URL + "/apis/metrics.k8s.io/v1beta1/namespaces/ns/pods?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("watch: %s", resp.Status)
	}
}
