package node

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// configError is a pod the node cannot start because something it references
// is missing; the kubelet reports it as CreateContainerConfigError and retries.
type configError struct {
	container string
	err       error
}

func (e *configError) Error() string { return e.err.Error() }

// objectSource fetches the ConfigMaps and Secrets a pod references. The Node
// authorizer lets a node read exactly those, one GET at a time, which is why
// the node uses no cluster-wide informers for them.
type objectSource interface {
	configMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error)
	secret(ctx context.Context, ns, name string) (*corev1.Secret, error)
	claim(ctx context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error)
	volume(ctx context.Context, name string) (*corev1.PersistentVolume, error)
	token(ctx context.Context, ns, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error)
}

type apiSource struct{ c kubernetes.Interface }

func (s apiSource) configMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	return getAsNode(ctx, func() (*corev1.ConfigMap, error) {
		return s.c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	})
}
func (s apiSource) secret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	return getAsNode(ctx, func() (*corev1.Secret, error) { return s.c.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}) })
}

func (s apiSource) claim(ctx context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error) {
	return getAsNode(ctx, func() (*corev1.PersistentVolumeClaim, error) {
		return s.c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	})
}
func (s apiSource) volume(ctx context.Context, name string) (*corev1.PersistentVolume, error) {
	return getAsNode(ctx, func() (*corev1.PersistentVolume, error) {
		return s.c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	})
}
func (s apiSource) token(ctx context.Context, ns, sa string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return getAsNode(ctx, func() (*authenticationv1.TokenRequest, error) {
		return s.c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	})
}

// getAsNode retries Forbidden for a moment: the Node authorizer learns that a
// new pod references an object from its own watch, which can trail the pod
// reaching this node by a few milliseconds.
func getAsNode[T any](ctx context.Context, get func() (T, error)) (T, error) {
	delay := 50 * time.Millisecond
	deadline := time.Now().Add(3 * time.Second)
	for {
		v, err := get()
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(delay):
		}
		delay *= 2
	}
}

// translator turns a Kubernetes Pod into the runtime contract's PodSpec.
type translator struct {
	src        objectSource
	nodeName   string
	nodeIP     string
	serviceEnv func(ns string) []corev1.EnvVar
	// protectedDirs may not be hostPath volumes (see hostPathAllowed).
	protectedDirs []string
	tokens        *tokenCache
	now           func() time.Time // tests
	// ephemeralFailed reports an ephemeral container left out of the spec.
	ephemeralFailed func(pod *corev1.Pod, container string, err error)
}

// podSpec translates pod. When a read from the API failed transiently on
// the way, the result is a *transientError (whatever else went wrong may be
// its consequence: a missing pull secret, a "configmap not found").
func (t *translator) podSpec(ctx context.Context, pod *corev1.Pod) (*runtimev1.PodSpec, error) {
	src := &transientSource{objectSource: t.src}
	tt := *t
	tt.src = src
	spec, err := tt.translate(ctx, pod)
	if first := src.seen(); first != nil {
		return nil, &transientError{first}
	}
	return spec, err
}

func (t *translator) translate(ctx context.Context, pod *corev1.Pod) (*runtimev1.PodSpec, error) {
	spec := &runtimev1.PodSpec{
		Uid:           string(pod.UID),
		Namespace:     pod.Namespace,
		Name:          pod.Name,
		RestartPolicy: restartPolicy(pod.Spec.RestartPolicy),
		Hostname:      pod.Name,
		Labels:        maps.Clone(pod.Labels),
		Annotations:   maps.Clone(pod.Annotations),
	}
	if pod.Spec.Hostname != "" {
		spec.Hostname = pod.Spec.Hostname
	}
	if pod.Spec.RuntimeClassName != nil {
		spec.RuntimeClassName = *pod.Spec.RuntimeClassName
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		spec.TerminationGracePeriodSeconds = g
	}
	for _, ref := range pod.Spec.ImagePullSecrets {
		s, err := t.src.secret(ctx, pod.Namespace, ref.Name)
		if err != nil {
			// The kubelet goes on without a missing pull secret.
			continue
		}
		if cfg, ok := dockerConfigJSON(s); ok {
			spec.PullSecrets = append(spec.PullSecrets, cfg)
		}
	}
	vols, err := t.volumes(ctx, pod, false)
	if err != nil {
		return nil, err
	}
	spec.Volumes = vols
	for _, c := range pod.Spec.InitContainers {
		cs, err := t.container(ctx, pod, &c)
		if err != nil {
			return nil, err
		}
		spec.InitContainers = append(spec.InitContainers, cs)
	}
	for _, c := range pod.Spec.Containers {
		cs, err := t.container(ctx, pod, &c)
		if err != nil {
			return nil, err
		}
		spec.Containers = append(spec.Containers, cs)
	}
	spec.EphemeralContainers = t.ephemeralContainers(ctx, pod)
	return spec, nil
}

// ephemeralContainers translates the pod's ephemeral containers (kubectl
// debug). The API gives them the fields of a container minus probes,
// lifecycle, ports and resources, so they translate as one. One whose
// environment cannot be resolved is left out (and reported by
// ephemeralFailed) instead of failing the whole pod: the pod runs already.
func (t *translator) ephemeralContainers(ctx context.Context, pod *corev1.Pod) []*runtimev1.EphemeralContainerSpec {
	var out []*runtimev1.EphemeralContainerSpec
	for _, ec := range pod.Spec.EphemeralContainers {
		c := corev1.Container(ec.EphemeralContainerCommon)
		c.LivenessProbe, c.ReadinessProbe, c.StartupProbe, c.Lifecycle, c.Ports = nil, nil, nil, nil, nil
		cs, err := t.container(ctx, pod, &c)
		if err != nil {
			if t.ephemeralFailed != nil {
				t.ephemeralFailed(pod, ec.Name, err)
			}
			continue
		}
		out = append(out, &runtimev1.EphemeralContainerSpec{Container: cs, TargetContainerName: ec.TargetContainerName})
	}
	return out
}

func restartPolicy(p corev1.RestartPolicy) runtimev1.RestartPolicy {
	switch p {
	case corev1.RestartPolicyOnFailure:
		return runtimev1.RestartPolicy_RESTART_POLICY_ON_FAILURE
	case corev1.RestartPolicyNever:
		return runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	}
	return runtimev1.RestartPolicy_RESTART_POLICY_ALWAYS
}

func pullPolicy(p corev1.PullPolicy) runtimev1.PullPolicy {
	switch p {
	case corev1.PullAlways:
		return runtimev1.PullPolicy_PULL_POLICY_ALWAYS
	case corev1.PullIfNotPresent:
		return runtimev1.PullPolicy_PULL_POLICY_IF_NOT_PRESENT
	case corev1.PullNever:
		return runtimev1.PullPolicy_PULL_POLICY_NEVER
	}
	return runtimev1.PullPolicy_PULL_POLICY_UNSPECIFIED
}

func (t *translator) container(ctx context.Context, pod *corev1.Pod, c *corev1.Container) (*runtimev1.ContainerSpec, error) {
	env, err := t.env(ctx, pod, c)
	if err != nil {
		return nil, &configError{container: c.Name, err: err}
	}
	cs := &runtimev1.ContainerSpec{
		Name:            c.Name,
		Image:           c.Image,
		ImagePullPolicy: pullPolicy(c.ImagePullPolicy),
		Command:         c.Command,
		Args:            c.Args,
		Env:             env,
		WorkingDir:      c.WorkingDir,
		Stdin:           c.Stdin,
		StdinOnce:       c.StdinOnce,
		Tty:             c.TTY,
		VolumeMounts:    volumeMounts(pod, c),
		Resources: &runtimev1.Resources{
			CpuRequestMillis:   c.Resources.Requests.Cpu().MilliValue(),
			CpuLimitMillis:     c.Resources.Limits.Cpu().MilliValue(),
			MemoryRequestBytes: c.Resources.Requests.Memory().Value(),
			MemoryLimitBytes:   c.Resources.Limits.Memory().Value(),
		},
		DefinitionHash: definitionHash(c),
	}
	if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
		cs.RestartPolicy = runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS
	}
	for _, p := range c.Ports {
		cs.Ports = append(cs.Ports, &runtimev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: string(p.Protocol)})
	}
	if err := probesAndHooks(c, cs); err != nil {
		return nil, &configError{container: c.Name, err: err}
	}
	return cs, nil
}

// definitionHash is the kubelet's container hash (HashContainer), over the
// API container spec: the runtime restarts a running container only when it
// changes, as the kubelet does. It covers what the API lets change on a
// running pod (the image), not what the node resolves (env from labels,
// annotations, ConfigMaps and Secrets), which a container only picks up
// when it starts again.
func definitionHash(c *corev1.Container) string {
	return strconv.FormatUint(kubecontainer.HashContainer(c), 16)
}

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
func (t *translator) env(ctx context.Context, pod *corev1.Pod, c *corev1.Container) ([]*runtimev1.EnvVar, error) {
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
	// declared holds envFrom and env variables (the kubelet's tmpEnv),
	// services the service links; expansion looks in that order.
	declared, services := map[string]string{}, map[string]string{}
	set := func(name, value string) {
		declared[name] = value
		put(name, value)
	}
	mapping := expansion.MappingFuncFor(declared, services)
	if t.serviceEnv != nil {
		for _, e := range t.serviceEnv(pod.Namespace) {
			services[e.Name] = e.Value
			put(e.Name, e.Value)
		}
	}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := t.src.configMap(ctx, pod.Namespace, from.ConfigMapRef.Name)
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
			s, err := t.src.secret(ctx, pod.Namespace, from.SecretRef.Name)
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

func (t *translator) valueFrom(ctx context.Context, pod *corev1.Pod, c *corev1.Container, from *corev1.EnvVarSource) (value string, skip bool, err error) {
	switch {
	case from.FieldRef != nil:
		v, err := t.fieldRef(pod, from.FieldRef.FieldPath)
		return v, false, err
	case from.ResourceFieldRef != nil:
		v, err := resourceFieldRef(pod, c, from.ResourceFieldRef)
		return v, false, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := t.src.configMap(ctx, pod.Namespace, ref.Name)
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
		s, err := t.src.secret(ctx, pod.Namespace, ref.Name)
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

func (t *translator) fieldRef(pod *corev1.Pod, path string) (string, error) {
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
	case "status.hostIP", "status.podIP":
		// Pods share the node's network until per-pod addresses land.
		return t.nodeIP, nil
	case "status.hostIPs", "status.podIPs":
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

func resourceFieldRef(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
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
	var q resource.Quantity
	switch ref.Resource {
	case "limits.cpu":
		q = target.Resources.Limits[corev1.ResourceCPU]
	case "requests.cpu":
		q = target.Resources.Requests[corev1.ResourceCPU]
	case "limits.memory":
		q = target.Resources.Limits[corev1.ResourceMemory]
	case "requests.memory":
		q = target.Resources.Requests[corev1.ResourceMemory]
	case "limits.ephemeral-storage":
		q = target.Resources.Limits[corev1.ResourceEphemeralStorage]
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

// dockerConfigJSON returns an image pull secret as {"auths": ...} JSON.
func dockerConfigJSON(s *corev1.Secret) ([]byte, bool) {
	switch s.Type {
	case corev1.SecretTypeDockerConfigJson:
		b, ok := s.Data[corev1.DockerConfigJsonKey]
		return b, ok
	case corev1.SecretTypeDockercfg:
		old, ok := s.Data[corev1.DockerConfigKey]
		if !ok {
			return nil, false
		}
		var auths map[string]json.RawMessage
		if json.Unmarshal(old, &auths) != nil {
			return nil, false
		}
		b, err := json.Marshal(map[string]any{"auths": auths})
		return b, err == nil
	}
	return nil, false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
