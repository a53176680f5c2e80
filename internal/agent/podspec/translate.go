// Package podspec turns an API Pod into the api/runtime/v1 PodSpec the
// runtime daemon runs: restart and pull policies, pull secrets, env (service
// links, envFrom, literal values expanded as the kubelet does, fieldRef,
// resourceFieldRef, ConfigMap and Secret keys), volumes (emptyDir, hostPath
// outside the data dir, claims bound to node-local volumes, and configMap,
// secret, downwardAPI and projected volumes with their content resolved,
// service-account tokens included), volume mounts, ports, probes and
// lifecycle hooks with named ports resolved, native sidecars, the kubelet's
// container hash, and ephemeral containers (kubectl debug).
//
// It reads what a pod references through a Source (the node's API client)
// and owns nothing else: no pod state, no runtime calls. A translation that
// cannot be made says why with a *ConfigError, *VolumeError or
// *TransientError, which the node reports as the kubelet does. The mapping,
// case by case, is the table in translate_test.go.
package podspec

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/utils/ptr"
)

// Config is what a Translator needs besides the pod.
type Config struct {
	// Source reads the objects pods reference.
	Source Source
	// NodeIP answers status.hostIP, and status.podIP for pods in the
	// node's network.
	NodeIP string
	// PodNetwork: the runtime gives pods their own addresses, so
	// status.podIP of a pod without hostNetwork is left for the runtime
	// to fill in (runtimev1.PodIPPlaceholder).
	PodNetwork bool
	// DNS is the cluster DNS pods get in their /etc/resolv.conf; nil:
	// pods keep the node's own resolver configuration.
	DNS *DNS
	// ServiceEnv gives the service-link variables of a namespace (see
	// APIServerEnv); nil: none.
	ServiceEnv func(pod *corev1.Pod) []corev1.EnvVar
	// ProtectedDirs may not be hostPath volumes, nor be inside one: k3sm's
	// data directory.
	ProtectedDirs []string
	// EphemeralFailed reports an ephemeral container left out of a spec
	// because it does not translate (the pod runs already); nil: not told.
	EphemeralFailed func(pod *corev1.Pod, container string, err error)
	// Allocatable is the node's allocatable resources: a downward-API
	// limits.cpu, limits.memory or limits.ephemeral-storage of a container
	// without that limit reads it, as with the kubelet.
	Allocatable corev1.ResourceList
}

// Translator turns Kubernetes Pods into the runtime contract's PodSpec. It
// keeps the pods' projected service-account tokens while they are fresh.
type Translator struct {
	src           Source
	nodeIP        string
	podNetwork    bool
	dns           *DNS
	serviceEnv    func(pod *corev1.Pod) []corev1.EnvVar
	protectedDirs []string
	tokens        *tokenCache
	now           func() time.Time // tests
	// ephemeralFailed reports an ephemeral container left out of the spec.
	ephemeralFailed func(pod *corev1.Pod, container string, err error)
	allocatable     corev1.ResourceList
}

// New returns a Translator.
func New(cfg Config) *Translator {
	return &Translator{src: cfg.Source, nodeIP: cfg.NodeIP, podNetwork: cfg.PodNetwork, dns: cfg.DNS, serviceEnv: cfg.ServiceEnv,
		protectedDirs: slices.Clone(cfg.ProtectedDirs), tokens: &tokenCache{}, ephemeralFailed: cfg.EphemeralFailed,
		allocatable: cfg.Allocatable.DeepCopy()}
}

// PodSpec translates pod, containers, volumes and ephemeral containers, for
// the runtime's CreatePod and UpdatePod. When a read from the API failed
// transiently on the way, the result is a *TransientError (whatever else
// went wrong may be its consequence: a missing pull secret, a "configmap not
// found"); otherwise a pod that does not translate is a *ConfigError or a
// *VolumeError.
func (t *Translator) PodSpec(ctx context.Context, pod *corev1.Pod) (*runtimev1.PodSpec, error) {
	src := &transientSource{Source: t.src}
	tt := *t
	tt.src = src
	spec, err := tt.translate(ctx, pod)
	if first := src.seen(); first != nil {
		return nil, &TransientError{first}
	}
	return spec, err
}

// VolumeRefresh is one round of the periodic refresh of running pods' files
// volumes: it reads each ConfigMap and Secret once however many pods
// reference it.
type VolumeRefresh struct{ t Translator }

// NewVolumeRefresh starts a refresh round.
func (t *Translator) NewVolumeRefresh() *VolumeRefresh {
	r := &VolumeRefresh{t: *t}
	r.t.src = &memoSource{Source: t.src}
	return r
}

// FilesVolumes resolves pod's configMap, secret, downwardAPI and projected
// volumes only (a token from the cache while it is fresh), for the
// runtime's UpdatePodVolumes. An error is a *VolumeError.
func (r *VolumeRefresh) FilesVolumes(ctx context.Context, pod *corev1.Pod) ([]*runtimev1.Volume, error) {
	return r.t.volumes(ctx, pod, true)
}

// Forget drops what the translator keeps of a deleted pod (its tokens).
func (t *Translator) Forget(uid types.UID) { t.tokens.forget(uid) }

func (t *Translator) translate(ctx context.Context, pod *corev1.Pod) (*runtimev1.PodSpec, error) {
	spec := &runtimev1.PodSpec{
		Uid:           string(pod.UID),
		Namespace:     pod.Namespace,
		Name:          pod.Name,
		RestartPolicy: restartPolicy(pod.Spec.RestartPolicy),
		Hostname:      pod.Name,
		Labels:        maps.Clone(pod.Labels),
		Annotations:   maps.Clone(pod.Annotations),
		HostNetwork:   pod.Spec.HostNetwork,
		HostPid:       pod.Spec.HostPID,
		HostIpc:       pod.Spec.HostIPC,
		HostUsers:     pod.Spec.HostUsers,
	}
	if pod.Spec.Hostname != "" {
		spec.Hostname = pod.Spec.Hostname
	}
	spec.Hostname = truncateHostname(spec.Hostname)
	for _, a := range pod.Spec.HostAliases {
		spec.HostAliases = append(spec.HostAliases, &runtimev1.HostAlias{Ip: a.IP, Hostnames: slices.Clone(a.Hostnames)})
	}
	if d := pod.Spec.ActiveDeadlineSeconds; d != nil {
		spec.ActiveDeadlineSeconds = ptr.To(*d)
	}
	if pod.Spec.Priority != nil { // set by the Priority admission plugin
		spec.Priority = *pod.Spec.Priority
	}
	rc, err := ResolvConf(pod, t.dns)
	if err != nil {
		return nil, err
	}
	spec.ResolvConf = rc
	if pod.Spec.RuntimeClassName != nil {
		spec.RuntimeClassName = *pod.Spec.RuntimeClassName
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		spec.TerminationGracePeriodSeconds = g
	}
	for _, ref := range pod.Spec.ImagePullSecrets {
		s, err := t.src.Secret(ctx, pod.Namespace, ref.Name)
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
func (t *Translator) ephemeralContainers(ctx context.Context, pod *corev1.Pod) []*runtimev1.EphemeralContainerSpec {
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

func (t *Translator) container(ctx context.Context, pod *corev1.Pod, c *corev1.Container) (*runtimev1.ContainerSpec, error) {
	env, err := t.env(ctx, pod, c)
	if err != nil {
		return nil, &ConfigError{Container: c.Name, Err: err}
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
		DefinitionHash:  definitionHash(c),
		SecurityContext: securityContext(pod, c),
		// The API defaults the path to /dev/termination-log.
		TerminationMessagePath:           c.TerminationMessagePath,
		TerminationMessageFallbackToLogs: c.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError,
	}
	if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
		cs.RestartPolicy = runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS
	}
	for _, p := range c.Ports {
		cs.Ports = append(cs.Ports, &runtimev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: string(p.Protocol)})
	}
	if err := probesAndHooks(c, cs); err != nil {
		return nil, &ConfigError{Container: c.Name, Err: err}
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

// truncateHostname keeps a hostname made from a long pod name within the
// 63 bytes the kernel and DNS take, without a trailing '-' or '.', as the
// kubelet does.
func truncateHostname(h string) string {
	const max = 63
	if len(h) <= max {
		return h
	}
	return strings.TrimRight(h[:max], "-.")
}
