package cluster

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/k3sm-dev/k3sm/internal/klimax/config"
)

type resettable struct{ meta.RESTMapper }

func (resettable) Reset() {}

// TestClientKubeAgainstFakeClientset exercises the client-go code paths
// (ConfigMap edit + CoreDNS restart, node labels, deployment readiness and
// LoadBalancer IP) against client-go's fake clientsets.
func TestClientKubeAgainstFakeClientset(t *testing.T) {
	one := int32(1)
	cs := fake.NewSimpleClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"}, Data: map[string]string{"Corefile": ".:53 {\n    forward . /etc/resolv.conf\n}\n"}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "controller", Namespace: "metallb-system", Generation: 1}, Spec: appsv1.DeploymentSpec{Replicas: &one},
			Status: appsv1.DeploymentStatus{ObservedGeneration: 1, AvailableReplicas: 1, UpdatedReplicas: 1}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dev-control-plane", Labels: map[string]string{"node-role.kubernetes.io/control-plane": "", "a": "1"}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "nginx", Namespace: "e2e"}, Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "172.30.1.16"}}}}},
	)
	k := &ClientKube{Clientset: cs, RetryEvery: 10 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	if err := ConfigureCoreDNS(ctx, k, []config.DNSResolver{{Domain: "runlocal.dev", Resolvers: []string{"8.8.8.8"}}}); err != nil {
		t.Fatal(err)
	}
	cf, _ := k.Corefile(ctx)
	if !strings.Contains(cf, "runlocal.dev:53 {") || !strings.Contains(cf, "forward . /etc/resolv.conf") {
		t.Errorf("corefile %q", cf)
	}
	d, _ := cs.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if d.Spec.Template.Annotations["klimax.dev/restartedAt"] == "" {
		t.Error("coredns not restarted")
	}
	if err := k.LabelNode(ctx, map[string]string{"b": "2"}, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	l, err := k.NodeLabels(ctx)
	if err != nil || l["b"] != "2" || l["a"] != "" {
		t.Errorf("labels %v %v", l, err)
	}
	if err := k.WaitDeployment(ctx, "metallb-system", "controller"); err != nil {
		t.Error(err)
	}
	short, c2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer c2()
	if err := k.WaitDeployment(short, "kube-system", "coredns"); err == nil {
		t.Error("unready deployment reported ready")
	}
	if ip, err := k.LoadBalancerIP(ctx, "e2e", "nginx"); err != nil || ip != "172.30.1.16" {
		t.Errorf("lb %q %v", ip, err)
	}
}

// TestClientKubeApplyOverHTTP checks the server-side apply requests client-go
// sends (path, patch type, field manager, force) against a local HTTP server
// standing in for the API server, including a retry while MetalLB's webhook
// is not ready.
func TestClientKubeApplyOverHTTP(t *testing.T) {
	var mu sync.Mutex
	var reqs []string
	fails := 1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		body, _ := io.ReadAll(r.Body)
		reqs = append(reqs, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+" "+r.Header.Get("Content-Type"))
		if strings.Contains(r.URL.Path, "ipaddresspools") && fails > 0 {
			fails--
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(500)
			io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"failed calling webhook: connection refused","code":500}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		var obj map[string]any
		if err := json.Unmarshal(body, &obj); err != nil {
			// apply patches arrive as YAML or JSON; echo a minimal object.
			obj = map[string]any{}
		}
		json.NewEncoder(w).Encode(obj)
	}))
	defer srv.Close()
	dyn, err := dynamic.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	rm := meta.NewDefaultRESTMapper(nil)
	rm.Add(schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta1", Kind: "IPAddressPool"}, meta.RESTScopeNamespace)
	rm.Add(schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta1", Kind: "L2Advertisement"}, meta.RESTScopeNamespace)
	rm.Add(schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}, meta.RESTScopeRoot)
	k := &ClientKube{Dynamic: dyn, Mapper: resettable{rm}, RetryEvery: 10 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "metallb-system"}}}
	if err := k.Apply(ctx, append([]*unstructured.Unstructured{ns}, MetalLBObjects(1, "172.30")...)); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"PATCH /api/v1/namespaces/metallb-system?fieldManager=klimax&force=true application/apply-patch+yaml",
		"PATCH /apis/metallb.io/v1beta1/namespaces/metallb-system/ipaddresspools/klimax?fieldManager=klimax&force=true application/apply-patch+yaml",
		"PATCH /apis/metallb.io/v1beta1/namespaces/metallb-system/ipaddresspools/klimax?fieldManager=klimax&force=true application/apply-patch+yaml",
		"PATCH /apis/metallb.io/v1beta1/namespaces/metallb-system/l2advertisements/klimax?fieldManager=klimax&force=true application/apply-patch+yaml",
	}
	if strings.Join(reqs, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s", strings.Join(reqs, "\n"))
	}
	// An object whose kind the server does not know fails with its name once ctx ends.
	short, c2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer c2()
	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "x.io/v1", "kind": "Nope", "metadata": map[string]any{"name": "n"}}}
	if err := k.Apply(short, []*unstructured.Unstructured{bad}); err == nil || !strings.Contains(err.Error(), "apply Nope /n") {
		t.Errorf("unknown kind: %v", err)
	}
}

// WaitReady waits for every node and kube-system pod (completed pods are
// fine) and, when time runs out, names what is not ready.
func TestClientKubeWaitReady(t *testing.T) {
	ready := corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}
	podReady := corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	cs := fake.NewSimpleClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dev-control-plane"}, Status: ready},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dev-worker"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "coredns-1", Namespace: "kube-system"}, Status: corev1.PodStatus{Phase: corev1.PodPending}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "etcd", Namespace: "kube-system"}, Status: podReady},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job-done", Namespace: "kube-system"}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "default"}},
	)
	k := &ClientKube{Clientset: cs, RetryEvery: 10 * time.Millisecond}
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := k.WaitReady(short)
	if err == nil || !strings.Contains(err.Error(), "node dev-worker") || !strings.Contains(err.Error(), "pod kube-system/coredns-1") ||
		strings.Contains(err.Error(), "etcd") || strings.Contains(err.Error(), "job-done") || strings.Contains(err.Error(), "app") {
		t.Fatalf("not ready: %v", err)
	}
	ctx, c2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer c2()
	go func() {
		time.Sleep(50 * time.Millisecond)
		n, _ := cs.CoreV1().Nodes().Get(ctx, "dev-worker", metav1.GetOptions{})
		n.Status = ready
		cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		p, _ := cs.CoreV1().Pods("kube-system").Get(ctx, "coredns-1", metav1.GetOptions{})
		p.Status = podReady
		cs.CoreV1().Pods("kube-system").UpdateStatus(ctx, p, metav1.UpdateOptions{})
	}()
	if err := k.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	empty := &ClientKube{Clientset: fake.NewSimpleClientset(), RetryEvery: 10 * time.Millisecond}
	s2, c3 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer c3()
	if err := empty.WaitReady(s2); err == nil || !strings.Contains(err.Error(), "no node registered") {
		t.Errorf("no nodes: %v", err)
	}
}
