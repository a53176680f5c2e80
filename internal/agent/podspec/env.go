package podspec

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/kubernetes/pkg/kubelet/envvars"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// env resolves a container's environment in the kubelet's order: service
// links first, then envFrom sources, then env entries (later wins).
//
// Values are final, as the kubelet's makeEnvironmentVariables makes them:
// only a literal `value` is $(VAR)-expanded (with the kubelet's own
// expansion package), from the envFrom variables and the env entries before
// it, then the service links; `$$` is a literal `$` and an unknown reference
// stays as written. Values from Secrets, ConfigMaps and the downward API are
// never expanded. Every variable goes out marked verbatim so the daemon uses
// it byte for byte (the contract's default, for older providers, is that the
// daemon expands; see EnvVar.verbatim).
func (t *Translator) env(ctx context.Context, pod *corev1.Pod, c *corev1.Container) ([]*runtimev1.EnvVar, error) {
	var out []*runtimev1.EnvVar
	index := map[string]int{}
	put := func(name, value string) {
		if i, ok := index[name]; ok {
			out[i].Value = value
			return
		}
		index[name] = len(out)
		out = append(out, &runtimev1.EnvVar{Name: name, Value: value, Verbatim: true})
	}
	defer func() {
		for _, v := range out {
			v.PodIp = strings.Contains(v.Value, runtimev1.PodIPPlaceholder)
		}
	}()
	// declared holds envFrom and env variables (the kubelet's tmpEnv),
	// services the service links; expansion looks in that order.
	declared, services := map[string]string{}, map[string]string{}
	set := func(name, value string) {
		declared[name] = value
		put(name, value)
	}
	mapping := expansion.MappingFuncFor(declared, services)
	if t.serviceEnv != nil {
		for _, e := range t.serviceEnv(pod) {
			services[e.Name] = e.Value
			put(e.Name, e.Value)
		}
	}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := t.src.ConfigMap(ctx, pod.Namespace, from.ConfigMapRef.Name)
			if err != nil {
				if optional(from.ConfigMapRef.Optional) && apierrors.IsNotFound(err) {
					continue
				}
				return nil, fmt.Errorf("configmap %q not found", from.ConfigMapRef.Name)
			}
			for _, k := range sortedKeys(cm.Data) {
				set(from.Prefix+k, cm.Data[k])
			}
		case from.SecretRef != nil:
			s, err := t.src.Secret(ctx, pod.Namespace, from.SecretRef.Name)
			if err != nil {
				if optional(from.SecretRef.Optional) && apierrors.IsNotFound(err) {
					continue
				}
				return nil, fmt.Errorf("secret %q not found", from.SecretRef.Name)
			}
			for _, k := range sortedKeys(s.Data) {
				set(from.Prefix+k, string(s.Data[k]))
			}
		}
	}
	for _, e := range c.Env {
		if e.Value != "" || e.ValueFrom == nil {
			set(e.Name, expansion.Expand(e.Value, mapping))
			continue
		}
		v, skip, err := t.valueFrom(ctx, pod, c, e.ValueFrom)
		if err != nil {
			return nil, err
		}
		if !skip {
			set(e.Name, v)
		}
	}
	return out, nil
}

func optional(b *bool) bool { return b != nil && *b }

func (t *Translator) valueFrom(ctx context.Context, pod *corev1.Pod, c *corev1.Container, from *corev1.EnvVarSource) (value string, skip bool, err error) {
	switch {
	case from.FieldRef != nil:
		v, err := t.fieldRef(pod, from.FieldRef.FieldPath)
		return v, false, err
	case from.ResourceFieldRef != nil:
		v, err := t.resourceFieldRef(pod, c, from.ResourceFieldRef)
		return v, false, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := t.src.ConfigMap(ctx, pod.Namespace, ref.Name)
		if err != nil {
			if optional(ref.Optional) && apierrors.IsNotFound(err) {
				return "", true, nil
			}
			return "", false, fmt.Errorf("configmap %q not found", ref.Name)
		}
		if v, ok := cm.Data[ref.Key]; ok {
			return v, false, nil
		}
		if v, ok := cm.BinaryData[ref.Key]; ok {
			return string(v), false, nil
		}
		if optional(ref.Optional) {
			return "", true, nil
		}
		return "", false, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := t.src.Secret(ctx, pod.Namespace, ref.Name)
		if err != nil {
			if optional(ref.Optional) && apierrors.IsNotFound(err) {
				return "", true, nil
			}
			return "", false, fmt.Errorf("secret %q not found", ref.Name)
		}
		if v, ok := s.Data[ref.Key]; ok {
			return string(v), false, nil
		}
		if optional(ref.Optional) {
			return "", true, nil
		}
		return "", false, fmt.Errorf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)
	}
	return "", true, nil
}

func (t *Translator) fieldRef(pod *corev1.Pod, path string) (string, error) {
	if k, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[k], nil
	}
	if k, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[k], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return t.nodeIP, nil
	case "status.podIP", "status.podIPs":
		if t.podNetwork && !pod.Spec.HostNetwork {
			// Known once the runtime made the pod's network.
			return runtimev1.PodIPPlaceholder, nil
		}
		return t.nodeIP, nil
	}
	return "", fmt.Errorf("unsupported fieldRef %q", path)
}

func subscript(path, prefix string) (string, bool) {
	if !strings.HasPrefix(path, prefix+"[") || !strings.HasSuffix(path, "]") {
		return "", false
	}
	k := path[len(prefix)+1 : len(path)-1]
	if uq, err := strconv.Unquote(k); err == nil {
		k = uq
	} else {
		k = strings.Trim(k, "'")
	}
	return k, true
}

// resourceFieldRef is the value of a downward-API resource of container c
// (or of the container ref names). An unset limit reads the node's
// allocatable, as the kubelet's does.
func (t *Translator) resourceFieldRef(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	target := c
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		target = nil
		for i := range pod.Spec.Containers {
			if pod.Spec.Containers[i].Name == ref.ContainerName {
				target = &pod.Spec.Containers[i]
			}
		}
		if target == nil {
			return "", fmt.Errorf("resourceFieldRef: no container %q", ref.ContainerName)
		}
	}
	limit := func(name corev1.ResourceName) resource.Quantity {
		if q, ok := target.Resources.Limits[name]; ok {
			return q
		}
		return t.allocatable[name]
	}
	var q resource.Quantity
	switch ref.Resource {
	case "limits.cpu":
		q = limit(corev1.ResourceCPU)
	case "requests.cpu":
		q = target.Resources.Requests[corev1.ResourceCPU]
	case "limits.memory":
		q = limit(corev1.ResourceMemory)
	case "requests.memory":
		q = target.Resources.Requests[corev1.ResourceMemory]
	case "limits.ephemeral-storage":
		q = limit(corev1.ResourceEphemeralStorage)
	case "requests.ephemeral-storage":
		q = target.Resources.Requests[corev1.ResourceEphemeralStorage]
	default:
		return "", fmt.Errorf("unsupported resourceFieldRef %q", ref.Resource)
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	// Round up, as the kubelet does (a 250m limit reads as 1 CPU).
	if strings.HasSuffix(ref.Resource, "cpu") {
		return strconv.FormatInt((q.MilliValue()+divisor.MilliValue()-1)/divisor.MilliValue(), 10), nil
	}
	return strconv.FormatInt((q.Value()+divisor.Value()-1)/divisor.Value(), 10), nil
}

// APIServerEnv gives pods the kubelet's KUBERNETES_SERVICE_* variables, so
// rest.InClusterConfig() works unchanged. server is the API's address as
// pods reach it: with a pod network the node serves Services, and it is
// the kubernetes Service's ClusterIP (https://<clusterIP>:443), as
// upstream; without one pods share the node's network and the kubernetes
// Service is not served, so it is the API server's own address, the one
// this node uses. The serving certificate covers both.
func APIServerEnv(server string) func(pod *corev1.Pod) []corev1.EnvVar {
	u, err := url.Parse(server)
	if err != nil || u.Hostname() == "" {
		return nil
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "443"
	}
	addr := "tcp://" + net.JoinHostPort(host, port)
	env := []corev1.EnvVar{
		{Name: "KUBERNETES_SERVICE_HOST", Value: host},
		{Name: "KUBERNETES_SERVICE_PORT", Value: port},
		{Name: "KUBERNETES_SERVICE_PORT_HTTPS", Value: port},
		{Name: "KUBERNETES_PORT", Value: addr},
		{Name: "KUBERNETES_PORT_" + port + "_TCP", Value: addr},
		{Name: "KUBERNETES_PORT_" + port + "_TCP_PROTO", Value: "tcp"},
		{Name: "KUBERNETES_PORT_" + port + "_TCP_PORT", Value: port},
		{Name: "KUBERNETES_PORT_" + port + "_TCP_ADDR", Value: host},
	}
	return func(*corev1.Pod) []corev1.EnvVar { return env }
}

// ServiceLinksEnv gives the kubelet's service-link variables from Services
// (k8s.io/kubernetes/pkg/kubelet/envvars, as the kubelet): the kubernetes
// Service's for every pod, and with enableServiceLinks (the default) those
// of every Service with a ClusterIP in the pod's namespace. Until the
// kubernetes Service is in the lister, fallback gives its variables.
func ServiceLinksEnv(l corelisters.ServiceLister, fallback func(*corev1.Pod) []corev1.EnvVar) func(pod *corev1.Pod) []corev1.EnvVar {
	return func(pod *corev1.Pod) []corev1.EnvVar {
		var svcs []*corev1.Service
		api, err := l.Services(metav1.NamespaceDefault).Get("kubernetes")
		if err == nil {
			svcs = append(svcs, api)
		}
		if pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks {
			list, _ := l.Services(pod.Namespace).List(labels.Everything())
			slices.SortFunc(list, func(a, b *corev1.Service) int { return strings.Compare(a.Name, b.Name) })
			for _, s := range list {
				if s.Namespace == metav1.NamespaceDefault && s.Name == "kubernetes" {
					continue
				}
				svcs = append(svcs, s)
			}
		}
		env := envvars.FromServices(svcs)
		if api == nil && fallback != nil {
			env = append(fallback(pod), env...)
		}
		return env
	}
}
