package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// Kube is what klimax does to a running cluster's API. The real
// implementation is client-go; flow tests use a recording fake.
type Kube interface {
	// Apply server-side-applies objects in order, retrying while CRDs or
	// webhooks they need are not ready yet, until ctx ends.
	Apply(ctx context.Context, objs []*unstructured.Unstructured) error
	// Delete removes objects in the given order (missing ones are fine).
	Delete(ctx context.Context, objs []*unstructured.Unstructured) error
	// WaitDeployment waits until a Deployment has all replicas available.
	WaitDeployment(ctx context.Context, namespace, name string) error
	// Corefile reads CoreDNS's Corefile; SetCorefile writes it and restarts CoreDNS.
	Corefile(ctx context.Context) (string, error)
	SetCorefile(ctx context.Context, corefile string) error
	// NodeLabels returns the labels of the control-plane node.
	NodeLabels(ctx context.Context) (map[string]string, error)
	// LabelNode sets and removes labels on every node.
	LabelNode(ctx context.Context, set map[string]string, remove []string) error
	// LoadBalancerIP waits for a Service's LoadBalancer ingress IP.
	LoadBalancerIP(ctx context.Context, namespace, name string) (string, error)
	// WaitReady waits until the API answers, every node is Ready and every
	// kube-system pod is Ready (or Succeeded); on ctx end the error names
	// what is not ready.
	WaitReady(ctx context.Context) error
}

// ClientKube is Kube over client-go.
type ClientKube struct {
	Clientset kubernetes.Interface
	Dynamic   dynamic.Interface
	Mapper    meta.ResettableRESTMapper
	// RetryEvery is the pause between Apply/wait attempts.
	RetryEvery time.Duration
}

// NewClientKube connects to the cluster described by kubeconfig.
func NewClientKube(kubeconfig []byte) (*ClientKube, error) {
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.Timeout = 30 * time.Second
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery()))
	return &ClientKube{Clientset: cs, Dynamic: dyn, Mapper: mapper, RetryEvery: 2 * time.Second}, nil
}

func (k *ClientKube) resource(obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	m, err := k.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		k.Mapper.Reset() // a CRD applied a moment ago is not in the cached discovery yet
		return nil, err
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = "default"
		}
		return k.Dynamic.Resource(m.Resource).Namespace(ns), nil
	}
	return k.Dynamic.Resource(m.Resource), nil
}

// retry runs fn until it succeeds or ctx ends, returning the last error.
func (k *ClientKube) retry(ctx context.Context, fn func() error) error {
	every := k.RetryEvery
	if every == 0 {
		every = 2 * time.Second
	}
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %v)", err, ctx.Err())
		case <-time.After(every):
		}
	}
}

func (k *ClientKube) Apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, obj := range objs {
		obj := obj
		err := k.retry(ctx, func() error {
			ri, err := k.resource(obj)
			if err != nil {
				return err
			}
			_, err = ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "klimax", Force: true})
			return err
		})
		if err != nil {
			return fmt.Errorf("apply %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
	}
	return nil
}

func (k *ClientKube) Delete(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, obj := range objs {
		ri, err := k.resource(obj)
		if err != nil {
			return err
		}
		if err := ri.Delete(ctx, obj.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	return nil
}

func (k *ClientKube) WaitDeployment(ctx context.Context, ns, name string) error {
	return k.retry(ctx, func() error {
		d, err := k.Clientset.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return deploymentReady(d)
	})
}

func deploymentReady(d *appsv1.Deployment) error {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if d.Status.ObservedGeneration < d.Generation || d.Status.AvailableReplicas < want || d.Status.UpdatedReplicas < want {
		return fmt.Errorf("deployment %s/%s: %d/%d available", d.Namespace, d.Name, d.Status.AvailableReplicas, want)
	}
	return nil
}

func (k *ClientKube) Corefile(ctx context.Context) (string, error) {
	cm, err := k.Clientset.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read coredns ConfigMap: %w", err)
	}
	cf, ok := cm.Data["Corefile"]
	if !ok {
		return "", fmt.Errorf("coredns ConfigMap has no Corefile")
	}
	return cf, nil
}

func (k *ClientKube) SetCorefile(ctx context.Context, corefile string) error {
	cms := k.Clientset.CoreV1().ConfigMaps("kube-system")
	cm, err := cms.Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if cm.Data["Corefile"] == corefile {
		return nil
	}
	cm.Data["Corefile"] = corefile
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update coredns ConfigMap: %w", err)
	}
	// Restart so the change is live now rather than after the reload interval.
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"klimax.dev/restartedAt":%q}}}}}`, time.Now().UTC().Format(time.RFC3339))
	_, err = k.Clientset.AppsV1().Deployments("kube-system").Patch(ctx, "coredns", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("restart coredns: %w", err)
	}
	return nil
}

func (k *ClientKube) controlPlane(ctx context.Context) (*corev1.Node, error) {
	nodes, err := k.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range nodes.Items {
		if _, ok := nodes.Items[i].Labels["node-role.kubernetes.io/control-plane"]; ok {
			return &nodes.Items[i], nil
		}
	}
	if len(nodes.Items) > 0 {
		return &nodes.Items[0], nil
	}
	return nil, fmt.Errorf("cluster has no nodes")
}

func (k *ClientKube) NodeLabels(ctx context.Context) (map[string]string, error) {
	n, err := k.controlPlane(ctx)
	if err != nil {
		return nil, err
	}
	return n.Labels, nil
}

func (k *ClientKube) LabelNode(ctx context.Context, set map[string]string, remove []string) error {
	labels := map[string]any{}
	for kk, v := range set {
		labels[kk] = v
	}
	for _, kk := range remove {
		labels[kk] = nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	nodes, err := k.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, n := range nodes.Items {
		if _, err := k.Clientset.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label node %s: %w", n.Name, err)
		}
	}
	return nil
}

func (k *ClientKube) LoadBalancerIP(ctx context.Context, ns, name string) (string, error) {
	var ip string
	err := k.retry(ctx, func() error {
		svc, err := k.Clientset.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				ip = in.IP
				return nil
			}
		}
		return fmt.Errorf("service %s/%s has no LoadBalancer IP yet", ns, name)
	})
	return ip, err
}

func (k *ClientKube) WaitReady(ctx context.Context) error {
	return k.retry(ctx, func() error { return k.notReady(ctx) })
}

// notReady returns nil when every node and kube-system pod is ready, else
// an error naming those that are not.
func (k *ClientKube) notReady(ctx context.Context) error {
	nodes, err := k.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("API not answering: %w", err)
	}
	var waiting []string
	if len(nodes.Items) == 0 {
		waiting = append(waiting, "no node registered")
	}
	for _, n := range nodes.Items {
		if !conditionTrue(n.Status.Conditions, corev1.NodeReady) {
			waiting = append(waiting, "node "+n.Name)
		}
	}
	pods, err := k.Clientset.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("API not answering: %w", err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		ready := false
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if !ready {
			waiting = append(waiting, "pod kube-system/"+p.Name)
		}
	}
	if len(waiting) > 0 {
		return fmt.Errorf("not ready: %s", strings.Join(waiting, ", "))
	}
	return nil
}

func conditionTrue(cs []corev1.NodeCondition, t corev1.NodeConditionType) bool {
	for _, c := range cs {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
