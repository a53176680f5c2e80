package podspec

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/labels"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// TestTranslate is the mapping from an API Pod to the runtime's PodSpec,
// one case per thing a pod can say. Each case starts from one pod "p" (uid
// u, namespace ns) with one container "c" (image img), changes what it is
// about, and gives the whole spec the runtime gets, or the error the node
// reports (a ConfigError is CreateContainerConfigError, a VolumeError is
// FailedMount). The objects pods reference are those of tableSource. The
// container hash is left out (TestDefinitionHashIsTheKubelets).
func TestTranslate(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		// want is the spec; nil when the translation fails with errKind
		// ("ConfigError <container>" or "VolumeError <volume>") and errText.
		want             *runtimev1.PodSpec
		errKind, errText string
		// serviceEnv, when set, is the translator's service links.
		serviceEnv []corev1.EnvVar
	}{
		// The pod.
		{name: "a minimal pod: hostname is the name, restartPolicy Always, requests and limits zero",
			pod: apiPod(), want: runtimeSpec()},
		{name: "pod fields: hostname, runtimeClassName, grace period, labels and annotations, restartPolicy OnFailure",
			pod: apiPod(func(p *corev1.Pod) {
				p.Labels, p.Annotations = map[string]string{"app": "web"}, map[string]string{"note": "n"}
				p.Spec.Hostname, p.Spec.RuntimeClassName = "h", ptr.To("native")
				p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5)
				p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.Labels, s.Annotations = map[string]string{"app": "web"}, map[string]string{"note": "n"}
				s.Hostname, s.RuntimeClassName = "h", "native"
				s.TerminationGracePeriodSeconds = ptr.To[int64](5)
				s.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_ON_FAILURE
			})},
		{name: "spec.priority (from the PriorityClass) for eviction ranking",
			pod:  apiPod(func(p *corev1.Pod) { p.Spec.Priority = ptr.To[int32](2000001000) }),
			want: runtimeSpec(func(s *runtimev1.PodSpec) { s.Priority = 2000001000 })},
		{name: "restartPolicy Never",
			pod:  apiPod(func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyNever }),
			want: runtimeSpec(func(s *runtimev1.PodSpec) { s.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_NEVER })},
		{name: "imagePullSecrets: docker config JSON, legacy .dockercfg as {auths}, a missing one skipped as by the kubelet",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "absent"}, {Name: "legacy"}}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.PullSecrets = [][]byte{[]byte(`{"auths":{"r.example":{"auth":"dTpw"}}}`), []byte(`{"auths":{"old.example":{"auth":"dTpw"}}}`)}
			})},

		// Containers.
		{name: "container fields: pull policy, command, args, workingDir, stdin, stdinOnce, tty, ports, resources",
			pod: apiPod(func(p *corev1.Pod) {
				c := &p.Spec.Containers[0]
				c.ImagePullPolicy, c.Command, c.Args, c.WorkingDir = corev1.PullNever, []string{"/app/server"}, []string{"--port", "80"}, "/app"
				c.Stdin, c.StdinOnce, c.TTY = true, true, true
				c.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}
				c.Resources = corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				c := s.Containers[0]
				c.ImagePullPolicy, c.Command, c.Args, c.WorkingDir = runtimev1.PullPolicy_PULL_POLICY_NEVER, []string{"/app/server"}, []string{"--port", "80"}, "/app"
				c.Stdin, c.StdinOnce, c.Tty = true, true, true
				c.Ports = []*runtimev1.ContainerPort{{Name: "http", ContainerPort: 80, Protocol: "TCP"}}
				c.Resources = &runtimev1.Resources{CpuRequestMillis: 250, CpuLimitMillis: 1000, MemoryRequestBytes: 64 << 20, MemoryLimitBytes: 128 << 20}
			})},
		{name: "pull policies Always and IfNotPresent; unset stays unspecified (the runtime applies the :latest rule)",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.Containers[0].ImagePullPolicy = corev1.PullAlways
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "d", Image: "img", ImagePullPolicy: corev1.PullIfNotPresent})
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.Containers[0].ImagePullPolicy = runtimev1.PullPolicy_PULL_POLICY_ALWAYS
				s.Containers = append(s.Containers, runtimeContainer("d", func(c *runtimev1.ContainerSpec) {
					c.ImagePullPolicy = runtimev1.PullPolicy_PULL_POLICY_IF_NOT_PRESENT
				}))
			})},
		{name: "init containers in order; one with restartPolicy Always is a native sidecar",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "img"},
					{Name: "proxy", Image: "img", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.InitContainers = []*runtimev1.ContainerSpec{runtimeContainer("setup"), runtimeContainer("proxy", func(c *runtimev1.ContainerSpec) {
					c.RestartPolicy = runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS
				})}
			})},
		{name: "securityContext: the pod's fields merge under the container's, for the runtime's sandbox",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), FSGroup: ptr.To[int64](2000),
					SupplementalGroups: []int64{3000}, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
				p.Spec.HostPID, p.Spec.HostUsers = true, ptr.To(false)
				p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](1001), RunAsNonRoot: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(true),
					AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_BIND_SERVICE"}},
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("prof.json")}}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.HostPid, s.HostUsers = true, ptr.To(false)
				s.Containers[0].SecurityContext = &runtimev1.SecurityContext{RunAsUser: ptr.To[int64](1001), FsGroup: ptr.To[int64](2000),
					SupplementalGroups: []int64{3000}, RunAsNonRoot: true, ReadOnlyRootFilesystem: true, AllowPrivilegeEscalation: ptr.To(false),
					CapabilitiesDrop: []string{"ALL"}, CapabilitiesAdd: []string{"NET_BIND_SERVICE"}, SeccompProfile: "Localhost/prof.json"}
			})},

		// Env: every variable goes out final and marked verbatim.
		{name: "env: a literal value is $(VAR)-expanded from the entries before it; $$ is $, an unknown or later name stays",
			pod: withEnv(corev1.EnvVar{Name: "A", Value: "a"}, corev1.EnvVar{Name: "B", Value: "$(A)-$$-$(LATER)-$(NOPE)"},
				corev1.EnvVar{Name: "LATER", Value: "l"}, corev1.EnvVar{Name: "EMPTY"}),
			want: wantEnv("A", "a", "B", "a-$-$(LATER)-$(NOPE)", "LATER", "l", "EMPTY", "")},
		{name: "env: fieldRef of metadata, spec and status (pods have the node's address)",
			pod: apiPod(func(p *corev1.Pod) {
				p.Labels, p.Annotations = map[string]string{"app": "web"}, map[string]string{"a.b/c": "$(X)"}
				p.Spec.NodeName, p.Spec.ServiceAccountName = "n1", "sa"
				p.Spec.Containers[0].Env = []corev1.EnvVar{fieldEnv("NAME", "metadata.name"), fieldEnv("NS", "metadata.namespace"),
					fieldEnv("UID", "metadata.uid"), fieldEnv("APP", "metadata.labels['app']"), fieldEnv("NOTE", `metadata.annotations["a.b/c"]`),
					fieldEnv("NODE", "spec.nodeName"), fieldEnv("SA", "spec.serviceAccountName"),
					fieldEnv("HOST_IP", "status.hostIP"), fieldEnv("POD_IP", "status.podIP"), fieldEnv("POD_IPS", "status.podIPs")}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.Labels, s.Annotations = map[string]string{"app": "web"}, map[string]string{"a.b/c": "$(X)"}
				s.Containers[0].Env = env("NAME", "p", "NS", "ns", "UID", "u", "APP", "web", "NOTE", "$(X)", "NODE", "n1", "SA", "sa",
					"HOST_IP", "192.0.2.1", "POD_IP", "192.0.2.1", "POD_IPS", "192.0.2.1")
			})},
		{name: "env: resourceFieldRef rounds up (250m reads 1 CPU), honours the divisor, and may name another container",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("64Mi")}
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "d", Image: "img", Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")}}})
				p.Spec.Containers[0].Env = []corev1.EnvVar{
					resourceEnv("CPU", "", "limits.cpu", ""), resourceEnv("CPU_M", "", "limits.cpu", "1m"),
					resourceEnv("MEM_MI", "", "limits.memory", "1Mi"), resourceEnv("D_MEM", "d", "requests.memory", "")}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.Containers[0].Resources = &runtimev1.Resources{CpuLimitMillis: 250, MemoryLimitBytes: 64 << 20}
				s.Containers[0].Env = env("CPU", "1", "CPU_M", "250", "MEM_MI", "64", "D_MEM", "33554432")
				s.Containers = append(s.Containers, runtimeContainer("d", func(c *runtimev1.ContainerSpec) { c.Resources.MemoryRequestBytes = 32 << 20 }))
			})},
		{name: "env: configMapKeyRef (data or binaryData) and secretKeyRef, never expanded; an optional missing key or object leaves the variable out",
			pod: withEnv(cmKeyEnv("A", "cm", "a", false), cmKeyEnv("BIN", "cm", "bin", false), secretKeyEnv("S", "s", "k", false),
				secretKeyEnv("REF", "s", "ref", false), cmKeyEnv("OPT", "cm", "zz", true), secretKeyEnv("OPT2", "absent", "k", true)),
			want: wantEnv("A", "1", "BIN", "\x00\x01", "S", "secret", "REF", "$(A)")},
		{name: "env: envFrom (with prefix, keys in order) first, then env entries, which override it",
			pod: apiPod(func(p *corev1.Pod) {
				c := &p.Spec.Containers[0]
				c.EnvFrom = []corev1.EnvFromSource{
					{Prefix: "CM_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}},
					{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}},
					{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: ptr.To(true)}},
				}
				c.Env = []corev1.EnvVar{{Name: "CM_a", Value: "overridden $(k)"}}
			}),
			want: wantEnv("CM_a", "overridden secret", "CM_b", "2", "k", "secret", "ref", "$(A)")},
		{name: "env: service links come first and expand last",
			serviceEnv: []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"}, {Name: "A", Value: "svc"}},
			pod:        withEnv(corev1.EnvVar{Name: "X", Value: "$(A)@$(KUBERNETES_SERVICE_HOST)"}, corev1.EnvVar{Name: "A", Value: "mine"}),
			want:       wantEnv("KUBERNETES_SERVICE_HOST", "127.0.0.1", "A", "mine", "X", "svc@127.0.0.1")},
		{name: "env: a missing ConfigMap is a configuration error of its container",
			pod: withEnv(cmKeyEnv("A", "absent", "a", false)), errKind: "ConfigError c", errText: `configmap "absent" not found`},
		{name: "env: a missing key of an existing Secret is a configuration error",
			pod: withEnv(secretKeyEnv("A", "s", "nope", false)), errKind: "ConfigError c", errText: "couldn't find key nope in Secret ns/s"},
		{name: "env: a missing envFrom Secret is a configuration error",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}}}}
			}),
			errKind: "ConfigError c", errText: `secret "absent" not found`},
		{name: "env: an unsupported fieldRef is a configuration error",
			pod: withEnv(fieldEnv("X", "status.phase")), errKind: "ConfigError c", errText: `unsupported fieldRef "status.phase"`},

		// Volumes and mounts.
		{name: "emptyDir: sizeLimit in bytes, medium Memory",
			pod: withVolumes(corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
				SizeLimit: ptr.To(resource.MustParse("1Mi")), Medium: corev1.StorageMediumMemory}}}),
			want: wantVolumes(&runtimev1.Volume{Name: "scratch", Source: &runtimev1.Volume_EmptyDir{EmptyDir: &runtimev1.EmptyDirVolume{SizeLimitBytes: 1 << 20, Memory: true}}})},
		{name: "hostPath outside the data dir, with its type",
			pod: withVolumes(corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: "/srv/data", Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}}),
			want: wantVolumes(&runtimev1.Volume{Name: "data", Source: &runtimev1.Volume_HostPath{HostPath: &runtimev1.HostPathVolume{Path: "/srv/data", Type: "DirectoryOrCreate"}}})},
		{name: "hostPath inside the data dir is refused",
			pod:     withVolumes(corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/k3sm/server/tls"}}}),
			errKind: "VolumeError v", errText: "hostPath /var/lib/k3sm/server/tls is refused: it is or contains k3sm's data directory /var/lib/k3sm"},
		{name: "hostPath containing the data dir is refused",
			pod:     withVolumes(corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var"}}}),
			errKind: "VolumeError v", errText: "is refused"},
		{name: "hostPath must be absolute",
			pod:     withVolumes(corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "data"}}}),
			errKind: "VolumeError v", errText: `hostPath "data" is not an absolute path`},
		{name: "persistentVolumeClaim bound to a hostPath volume; readOnly on the claim makes every mount read-only",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.Volumes = []corev1.Volume{{Name: "pvc", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
					ClaimName: "bound", ReadOnly: true}}}}
				p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "pvc", MountPath: "/data"}}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.Volumes = []*runtimev1.Volume{{Name: "pvc", Source: &runtimev1.Volume_HostPath{HostPath: &runtimev1.HostPathVolume{
					Path: "/var/lib/k3sm/storage/pvc-1", Type: "DirectoryOrCreate"}}}}
				s.Containers[0].VolumeMounts = []*runtimev1.VolumeMount{{Name: "pvc", MountPath: "/data", ReadOnly: true}}
			})},
		{name: "persistentVolumeClaim bound to a local volume",
			pod:  withVolumes(corev1.Volume{Name: "pvc", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "local"}}}),
			want: wantVolumes(&runtimev1.Volume{Name: "pvc", Source: &runtimev1.Volume_LocalPath{LocalPath: &runtimev1.LocalPathVolume{Path: "/mnt/disk1"}}})},
		{name: "persistentVolumeClaim not bound yet: FailedMount, retried",
			pod:     withVolumes(corev1.Volume{Name: "pvc", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "pending"}}}),
			errKind: "VolumeError pvc", errText: `persistentvolumeclaim "pending" is not bound yet (phase Pending)`},
		{name: "ephemeral volume: the claim the ephemeral volume controller made, <pod>-<volume>",
			pod: withVolumes(corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}}),
			want: wantVolumes(&runtimev1.Volume{Name: "scratch", Source: &runtimev1.Volume_HostPath{HostPath: &runtimev1.HostPathVolume{
				Path: "/var/lib/k3sm/storage/pvc-1", Type: "DirectoryOrCreate"}}})},
		{name: "configMap volume: every key (binaryData too) at 0644, or the items with their modes",
			pod: withVolumes(
				corev1.Volume{Name: "all", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}},
				corev1.Volume{Name: "items", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, DefaultMode: ptr.To[int32](0o600),
					Items: []corev1.KeyToPath{{Key: "a", Path: "dir/first"}, {Key: "b", Path: "second", Mode: ptr.To[int32](0o400)}}}}}),
			want: wantVolumes(
				filesVolume("all", file("a", "1", 0o644), file("b", "2", 0o644), file("bin", "\x00\x01", 0o644)),
				filesVolume("items", file("dir/first", "1", 0o600), file("second", "2", 0o400)))},
		{name: "configMap volume naming a key the ConfigMap lacks: FailedMount",
			pod: withVolumes(corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Items: []corev1.KeyToPath{{Key: "zz", Path: "x"}}}}}),
			errKind: "VolumeError v", errText: `configmap "cm" references non-existent config key: zz`},
		{name: "secret volume; an optional missing one is an empty volume",
			pod: withVolumes(
				corev1.Volume{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s", Items: []corev1.KeyToPath{{Key: "k", Path: "key"}}}}},
				corev1.Volume{Name: "opt", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "absent", Optional: ptr.To(true)}}}),
			want: wantVolumes(filesVolume("sec", file("key", "secret", 0o644)), filesVolume("opt"))},
		{name: "downwardAPI volume: labels and annotations as sorted key=\"value\" lines, fields, resources with a divisor",
			pod: apiPod(func(p *corev1.Pod) {
				p.Labels = map[string]string{"b": "2", "a": `x"y`}
				p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
				p.Spec.Volumes = []corev1.Volume{{Name: "down", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
					{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
					{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}, Mode: ptr.To[int32](0o400)},
					{Path: "mem", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "c", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}},
				}}}}}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.Labels = map[string]string{"b": "2", "a": `x"y`}
				s.Containers[0].Resources.MemoryLimitBytes = 64 << 20
				s.Volumes = []*runtimev1.Volume{filesVolume("down", file("labels", "a=\"x\\\"y\"\nb=\"2\"", 0o644), file("name", "p", 0o400), file("mem", "64", 0o644))}
			})},
		{name: "projected volume (kube-api-access): a service-account token bound to the pod, a ConfigMap item, the namespace",
			pod: withVolumes(corev1.Volume{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](0o640),
				Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3600)}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Items: []corev1.KeyToPath{{Key: "a", Path: "ca.crt"}}}},
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
				}}}}),
			want: wantVolumes(filesVolume("kube-api-access", file("token", "token-1", 0o640), file("ca.crt", "1", 0o640), file("namespace", "ns", 0o640)))},
		{name: "projected sources that write the same path: FailedMount",
			pod: withVolumes(corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}},
				{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Items: []corev1.KeyToPath{{Key: "k", Path: "a"}}}},
			}}}}),
			errKind: "VolumeError v", errText: "projected sources both write a"},
		{name: "a volume type native pods cannot mount: FailedMount naming what is supported",
			pod:     withVolumes(corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "x", Path: "/"}}}),
			errKind: "VolumeError v", errText: "this volume type is not supported by k3sm's native pods; supported: emptyDir"},
		{name: "volume mounts: mountPath, readOnly, subPath, subPathExpr as given",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
				p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/a", ReadOnly: true, SubPath: "x"},
					{Name: "scratch", MountPath: "/b", SubPathExpr: "$(POD)"}}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.Volumes = []*runtimev1.Volume{{Name: "scratch", Source: &runtimev1.Volume_EmptyDir{EmptyDir: &runtimev1.EmptyDirVolume{}}}}
				s.Containers[0].VolumeMounts = []*runtimev1.VolumeMount{{Name: "scratch", MountPath: "/a", ReadOnly: true, SubPath: "x"},
					{Name: "scratch", MountPath: "/b", SubPathExpr: "$(POD)"}}
			})},

		// Probes and hooks (docs/probes.md).
		{name: "probes: httpGet on a named port with headers, tcpSocket, grpc, exec; timings and thresholds as given",
			pod: apiPod(func(p *corev1.Pod) {
				c := &p.Spec.Containers[0]
				c.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
				c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http"),
					Scheme: corev1.URISchemeHTTPS, HTTPHeaders: []corev1.HTTPHeader{{Name: "X-A", Value: "1"}}}},
					InitialDelaySeconds: 3, TimeoutSeconds: 2, PeriodSeconds: 5, SuccessThreshold: 1, FailureThreshold: 4}
				c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("8080"), Host: "127.0.0.2"}}}
				c.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 7000, Service: ptr.To("svc")}}}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				c := s.Containers[0]
				c.Ports = []*runtimev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
				c.LivenessProbe = &runtimev1.Probe{Handler: &runtimev1.Probe_HttpGet{HttpGet: &runtimev1.HTTPGetAction{Path: "/healthz", Port: 8080, Scheme: "HTTPS",
					Headers: []*runtimev1.EnvVar{{Name: "X-A", Value: "1"}}}},
					InitialDelaySeconds: 3, TimeoutSeconds: 2, PeriodSeconds: 5, SuccessThreshold: 1, FailureThreshold: 4}
				c.ReadinessProbe = &runtimev1.Probe{Handler: &runtimev1.Probe_TcpSocket{TcpSocket: &runtimev1.TCPSocketAction{Port: 8080, Host: "127.0.0.2"}}}
				c.StartupProbe = &runtimev1.Probe{Handler: &runtimev1.Probe_Grpc{Grpc: &runtimev1.GRPCAction{Port: 7000, Service: "svc"}}}
			})},
		{name: "hooks: postStart exec, preStop sleep; a tcpSocket hook is passed on for the runtime to fail as the kubelet does",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{
					PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "true"}}},
					PreStop:   &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 5}}}
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "d", Image: "img", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 80}},
					Lifecycle: &corev1.Lifecycle{
						PostStart: &corev1.LifecycleHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(81)}},
						PreStop:   &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/quit", Port: intstr.FromString("web")}}}})
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.Containers[0].Lifecycle = &runtimev1.Lifecycle{
					PostStart: &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_Exec{Exec: &runtimev1.ExecAction{Command: []string{"sh", "-c", "true"}}}},
					PreStop:   &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_SleepSeconds{SleepSeconds: 5}}}
				s.Containers = append(s.Containers, runtimeContainer("d", func(c *runtimev1.ContainerSpec) {
					c.Ports = []*runtimev1.ContainerPort{{Name: "web", ContainerPort: 80}}
					c.Lifecycle = &runtimev1.Lifecycle{
						PostStart: &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_TcpSocket{TcpSocket: &runtimev1.TCPSocketAction{Port: 81}}},
						PreStop:   &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_HttpGet{HttpGet: &runtimev1.HTTPGetAction{Path: "/quit", Port: 80}}}}
				}))
			})},
		{name: "a probe on a port name the container does not declare is a configuration error naming the field",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("metrics")}}}
			}),
			errKind: "ConfigError c", errText: `container "c": readinessProbe.tcpSocket.port "metrics": no container port has that name`},
		{name: "a probe without a handler is a configuration error",
			pod:     apiPod(func(p *corev1.Pod) { p.Spec.Containers[0].LivenessProbe = &corev1.Probe{PeriodSeconds: 1} }),
			errKind: "ConfigError c", errText: `container "c": livenessProbe has no handler`},

		// Ephemeral containers (kubectl debug).
		{name: "ephemeral container: translated as a container, with its target",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{TargetContainerName: "c", EphemeralContainerCommon: corev1.EphemeralContainerCommon{
					Name: "debugger", Image: "busybox", Command: []string{"sh"}, Stdin: true, TTY: true,
					Env: []corev1.EnvVar{fieldEnv("POD", "metadata.name")}}}}
			}),
			want: runtimeSpec(func(s *runtimev1.PodSpec) {
				s.EphemeralContainers = []*runtimev1.EphemeralContainerSpec{{TargetContainerName: "c", Container: runtimeContainer("debugger", func(c *runtimev1.ContainerSpec) {
					c.Image, c.Command, c.Stdin, c.Tty, c.Env = "busybox", []string{"sh"}, true, true, env("POD", "p")
				})}}
			})},
		{name: "ephemeral container whose env does not resolve: left out (and reported), the pod still translates",
			pod: apiPod(func(p *corev1.Pod) {
				p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
					Name: "broken", Image: "busybox", Env: []corev1.EnvVar{cmKeyEnv("X", "absent", "k", false)}}}}
			}),
			want: runtimeSpec()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &Translator{src: tableSource(), nodeIP: "192.0.2.1", protectedDirs: []string{"/var/lib/k3sm"}, tokens: &tokenCache{},
				now: func() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }}
			if tc.serviceEnv != nil {
				tr.serviceEnv = func(*corev1.Pod) []corev1.EnvVar { return tc.serviceEnv }
			}
			got, err := tr.PodSpec(context.Background(), tc.pod)
			if tc.want == nil {
				if kind := errorKind(err); kind != tc.errKind || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("got %v (%s, spec %v), want a %s with %q", err, kind, got, tc.errKind, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range append(append(append([]*runtimev1.ContainerSpec{}, got.InitContainers...), got.Containers...), ephemeralSpecs(got)...) {
				if c.DefinitionHash == "" {
					t.Errorf("container %s has no definition hash", c.Name)
				}
				c.DefinitionHash = ""
			}
			if !proto.Equal(got, tc.want) {
				t.Fatalf("got\n%s\nwant\n%s", prototext.Format(got), prototext.Format(tc.want))
			}
		})
	}
}

// tableSource holds the objects TestTranslate's pods reference.
func tableSource() fakeSource {
	tokens := 0
	return fakeSource{
		cms: map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"a": "1", "b": "2"}, BinaryData: map[string][]byte{"bin": {0, 1}}}},
		secrets: map[string]*corev1.Secret{
			"s":       {Data: map[string][]byte{"k": []byte("secret"), "ref": []byte("$(A)")}},
			"regcred": {Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"r.example":{"auth":"dTpw"}}}`)}},
			"legacy":  {Type: corev1.SecretTypeDockercfg, Data: map[string][]byte{corev1.DockerConfigKey: []byte(`{"old.example":{"auth":"dTpw"}}`)}},
		},
		claims: map[string]*corev1.PersistentVolumeClaim{
			"pending":   {Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}},
			"bound":     {Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-1"}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}},
			"p-scratch": {Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-1"}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}},
			"local":     {Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-2"}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}},
		},
		pvs: map[string]*corev1.PersistentVolume{
			"pv-1": {Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/k3sm/storage/pvc-1", Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}}},
			"pv-2": {Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
				Local: &corev1.LocalVolumeSource{Path: "/mnt/disk1"}}}},
		},
		tokens: &tokens,
	}
}

func errorKind(err error) string {
	var ce *ConfigError
	var ve *VolumeError
	switch {
	case errors.As(err, &ce):
		return "ConfigError " + ce.Container
	case errors.As(err, &ve):
		return "VolumeError " + ve.Volume
	case err == nil:
		return "no error"
	}
	return "other error"
}

func ephemeralSpecs(s *runtimev1.PodSpec) []*runtimev1.ContainerSpec {
	var out []*runtimev1.ContainerSpec
	for _, ec := range s.EphemeralContainers {
		out = append(out, ec.Container)
	}
	return out
}

// apiPod is pod p (uid u, namespace ns) with container c (image img),
// changed by each of change.
func apiPod(change ...func(*corev1.Pod)) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img"}}}}
	for _, f := range change {
		f(pod)
	}
	return pod
}

// runtimeSpec is the spec of apiPod(), changed by each of change.
func runtimeSpec(change ...func(*runtimev1.PodSpec)) *runtimev1.PodSpec {
	s := &runtimev1.PodSpec{Uid: "u", Namespace: "ns", Name: "p", Hostname: "p", RestartPolicy: runtimev1.RestartPolicy_RESTART_POLICY_ALWAYS,
		Containers: []*runtimev1.ContainerSpec{runtimeContainer("c")}}
	for _, f := range change {
		f(s)
	}
	return s
}

// runtimeContainer is the spec of a container with only a name and image img.
func runtimeContainer(name string, change ...func(*runtimev1.ContainerSpec)) *runtimev1.ContainerSpec {
	c := &runtimev1.ContainerSpec{Name: name, Image: "img", Resources: &runtimev1.Resources{}}
	for _, f := range change {
		f(c)
	}
	return c
}

func withEnv(env ...corev1.EnvVar) *corev1.Pod {
	return apiPod(func(p *corev1.Pod) { p.Spec.Containers[0].Env = env })
}

// env is name, value pairs, as the runtime gets them (verbatim).
func env(kv ...string) []*runtimev1.EnvVar {
	var out []*runtimev1.EnvVar
	for i := 0; i < len(kv); i += 2 {
		out = append(out, &runtimev1.EnvVar{Name: kv[i], Value: kv[i+1], Verbatim: true})
	}
	return out
}

func wantEnv(kv ...string) *runtimev1.PodSpec {
	return runtimeSpec(func(s *runtimev1.PodSpec) { s.Containers[0].Env = env(kv...) })
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

func resourceEnv(name, container, res, divisor string) corev1.EnvVar {
	sel := &corev1.ResourceFieldSelector{ContainerName: container, Resource: res}
	if divisor != "" {
		sel.Divisor = resource.MustParse(divisor)
	}
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: sel}}
}

func cmKeyEnv(name, cm, key string, optional bool) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: cm}, Key: key, Optional: ptr.To(optional)}}}
}

func secretKeyEnv(name, secret, key string, optional bool) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key, Optional: ptr.To(optional)}}}
}

func withVolumes(vols ...corev1.Volume) *corev1.Pod {
	return apiPod(func(p *corev1.Pod) { p.Spec.Volumes = vols })
}

func wantVolumes(vols ...*runtimev1.Volume) *runtimev1.PodSpec {
	return runtimeSpec(func(s *runtimev1.PodSpec) { s.Volumes = vols })
}

func filesVolume(name string, files ...*runtimev1.VolumeFile) *runtimev1.Volume {
	return &runtimev1.Volume{Name: name, Source: &runtimev1.Volume_Files{Files: &runtimev1.FilesVolume{Files: files}}}
}

func file(path, content string, mode uint32) *runtimev1.VolumeFile {
	return &runtimev1.VolumeFile{Path: path, Content: []byte(content), Mode: mode}
}

type fakeSource struct {
	cms     map[string]*corev1.ConfigMap
	secrets map[string]*corev1.Secret
	claims  map[string]*corev1.PersistentVolumeClaim
	pvs     map[string]*corev1.PersistentVolume
	// tokens counts token requests; each returns "token-<n>".
	tokens *int
	ctbs   []certificatesv1.ClusterTrustBundle
}

func (f fakeSource) ClusterTrustBundles(_ context.Context, signer string, sel labels.Selector) ([]certificatesv1.ClusterTrustBundle, error) {
	var out []certificatesv1.ClusterTrustBundle
	for _, b := range f.ctbs {
		if b.Spec.SignerName == signer && sel.Matches(labels.Set(b.Labels)) {
			out = append(out, b)
		}
	}
	return out, nil
}

func (f fakeSource) ClusterTrustBundle(_ context.Context, name string) (*certificatesv1.ClusterTrustBundle, error) {
	for _, b := range f.ctbs {
		if b.Name == name {
			return &b, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "certificates.k8s.io", Resource: "clustertrustbundles"}, name)
}

func (f fakeSource) Claim(_ context.Context, _, name string) (*corev1.PersistentVolumeClaim, error) {
	if c, ok := f.claims[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "persistentvolumeclaims"}, name)
}

func (f fakeSource) Volume(_ context.Context, name string) (*corev1.PersistentVolume, error) {
	if v, ok := f.pvs[name]; ok {
		return v, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "persistentvolumes"}, name)
}

func (f fakeSource) Token(_ context.Context, _, sa string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	if f.tokens == nil {
		return nil, apierrors.NewForbidden(schema.GroupResource{Resource: "serviceaccounts/token"}, sa, errors.New("no tokens"))
	}
	*f.tokens++
	out := req.DeepCopy()
	out.Status.Token = fmt.Sprintf("token-%d", *f.tokens)
	return out, nil
}

func (f fakeSource) ConfigMap(_ context.Context, _, name string) (*corev1.ConfigMap, error) {
	if cm, ok := f.cms[name]; ok {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func (f fakeSource) Secret(_ context.Context, _, name string) (*corev1.Secret, error) {
	if s, ok := f.secrets[name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func TestEnvResolution(t *testing.T) {
	src := fakeSource{
		cms:     map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"a": "1", "b": "2"}}},
		secrets: map[string]*corev1.Secret{"s": {Data: map[string][]byte{"k": []byte("secret")}}},
	}
	tr := &Translator{src: src, nodeIP: "192.0.2.1", allocatable: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi")}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{
			Name:      "c",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}},
			EnvFrom: []corev1.EnvFromSource{
				{Prefix: "CM_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}},
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: ptr.To(true)}},
			},
			Env: []corev1.EnvVar{
				{Name: "CM_a", Value: "overridden"},
				{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "k"}}},
				{Name: "OPT", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "zz", Optional: ptr.To(true)}}},
				{Name: "LBL", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
				{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				{Name: "CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}},
				// No memory limit: the node's allocatable, as the kubelet.
				resourceEnv("MEM", "", "limits.memory", "1Mi"),
				resourceEnv("MEMREQ", "", "requests.memory", ""),
			},
		}}}}
	spec, err := tr.PodSpec(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var order []string
	for _, e := range spec.Containers[0].Env {
		got[e.Name] = e.Value
		order = append(order, e.Name)
	}
	want := map[string]string{"CM_a": "overridden", "CM_b": "2", "S": "secret", "LBL": "x", "IP": "192.0.2.1", "CPU": "1", "MEM": "4096", "MEMREQ": "0"}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if _, ok := got["OPT"]; ok {
		t.Fatal("an optional missing key must leave the variable unset")
	}
	if order[0] != "CM_a" || order[1] != "CM_b" {
		t.Fatalf("envFrom entries must come first, in key order: %v", order)
	}

	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{
		SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "missing"}, Key: "k"}}})
	_, err = tr.PodSpec(context.Background(), pod)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Container != "c" {
		t.Fatalf("want a configError for container c, got %v", err)
	}
}

func TestDockerConfigFromLegacySecret(t *testing.T) {
	s := &corev1.Secret{Type: corev1.SecretTypeDockercfg, Data: map[string][]byte{corev1.DockerConfigKey: []byte(`{"r.example":{"auth":"dTpw"}}`)}}
	b, ok := dockerConfigJSON(s)
	if !ok || string(b) != `{"auths":{"r.example":{"auth":"dTpw"}}}` {
		t.Fatalf("%s %v", b, ok)
	}
}

// TestEnvExpansionAsKubelet: only literal values are $(VAR)-expanded (from
// envFrom, earlier env entries, then the service links); values from
// Secrets, ConfigMaps and the downward API reach the runtime byte for byte,
// marked verbatim so the daemon does not expand them again.
func TestEnvExpansionAsKubelet(t *testing.T) {
	src := fakeSource{
		cms: map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"A": "from-cm", "REF": "$(A)"}}},
		secrets: map[string]*corev1.Secret{"s": {Data: map[string][]byte{
			"pw": []byte("pa$$w0rd"), "home": []byte("$(HOME)x"), "other": []byte("$(A)")}}},
	}
	svc := func(*corev1.Pod) []corev1.EnvVar {
		return []corev1.EnvVar{{Name: "KUBERNETES_PORT", Value: "tcp://127.0.0.1:6443"}, {Name: "A", Value: "svc"}}
	}
	tr := &Translator{src: src, nodeIP: "127.0.0.1", serviceEnv: svc}
	secretRef := func(k string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: k}}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Annotations: map[string]string{"note": "$(A)$$"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:    "c",
			EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}},
			Env: []corev1.EnvVar{
				{Name: "PW", ValueFrom: secretRef("pw")},
				{Name: "HOMEX", ValueFrom: secretRef("home")},
				{Name: "OTHER", ValueFrom: secretRef("other")},
				{Name: "CMREF", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "REF"}}},
				{Name: "NOTE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['note']"}}},
				{Name: "LIT", Value: "$(A)-$$"},
				{Name: "CHAIN", Value: "$(LIT)/$(PW)/$(KUBERNETES_PORT)/$(LATER)/$(NOPE)/$$(A)"},
				{Name: "LATER", Value: "l"},
				{Name: "EMPTY"},
			},
		}}}}
	spec, err := tr.PodSpec(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range spec.Containers[0].Env {
		if !e.Verbatim {
			t.Errorf("%s not marked verbatim", e.Name)
		}
		got[e.Name] = e.Value
	}
	want := map[string]string{
		"PW": "pa$$w0rd", "HOMEX": "$(HOME)x", "OTHER": "$(A)", "REF": "$(A)", "CMREF": "$(A)", "NOTE": "$(A)$$",
		// The configMap's A (envFrom) wins over the service link's A.
		"LIT":   "from-cm-$",
		"CHAIN": "from-cm-$/pa$$w0rd/tcp://127.0.0.1:6443/$(LATER)/$(NOPE)/$(A)",
		"LATER": "l", "EMPTY": "", "A": "from-cm", "KUBERNETES_PORT": "tcp://127.0.0.1:6443",
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %q, want %q", k, g, v)
		}
	}
}

// TestDefinitionHashIsTheKubelets: the hash covers the API container spec
// (the image), not the env the node resolves from labels or ConfigMaps.
func TestDefinitionHashIsTheKubelets(t *testing.T) {
	src := fakeSource{cms: map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"k": "1"}}}}
	tr := &Translator{src: src, nodeIP: "127.0.0.1"}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{"v": "1"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1", Env: []corev1.EnvVar{
			{Name: "L", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['v']"}}},
			{Name: "K", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "k"}}},
		}}}}}
	hash := func() (string, string) {
		spec, err := tr.PodSpec(context.Background(), pod)
		if err != nil {
			t.Fatal(err)
		}
		c := spec.Containers[0]
		return c.DefinitionHash, c.Env[0].Value + c.Env[1].Value
	}
	h1, env1 := hash()
	if h1 == "" {
		t.Fatal("no definition hash")
	}
	pod.Labels["v"] = "2"
	src.cms["cm"].Data["k"] = "2"
	h2, env2 := hash()
	if env1 == env2 || h1 != h2 {
		t.Fatalf("label/ConfigMap change: env %q -> %q, hash %s -> %s (want the env to change, the hash not)", env1, env2, h1, h2)
	}
	pod.Spec.Containers[0].Image = "busybox:2"
	if h3, _ := hash(); h3 == h1 {
		t.Fatal("a new image must change the hash")
	}
}

func debugPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "u1"},
		Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{Name: "app", Image: "native", Command: []string{"/bin/sleep", "600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			EphemeralContainers: []corev1.EphemeralContainer{
				{TargetContainerName: "app", EphemeralContainerCommon: corev1.EphemeralContainerCommon{
					Name: "debugger", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent,
					Command: []string{"sh"}, Args: []string{"-c", "ls /data"}, WorkingDir: "/tmp",
					Env:   []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
					Stdin: true, TTY: true,
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/mnt/data", ReadOnly: true}},
				}},
				{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "broken", Image: "busybox",
					Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "missing"}, Key: "k"}}}}}},
			},
		},
	}
}

// Ephemeral containers translate as containers (image, command/args, env,
// workingDir, stdin/tty, volume mounts) with their target; one whose env
// cannot be resolved is left out and reported, and the pod still translates.
func TestEphemeralContainersTranslate(t *testing.T) {
	var failed []string
	tr := &Translator{src: fakeSource{}, nodeIP: "192.0.2.1",
		ephemeralFailed: func(_ *corev1.Pod, c string, err error) { failed = append(failed, c+": "+err.Error()) }}
	spec, err := tr.PodSpec(context.Background(), debugPod())
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.EphemeralContainers) != 1 {
		t.Fatalf("ephemeral containers: %v", spec.EphemeralContainers)
	}
	ec := spec.EphemeralContainers[0]
	c := ec.GetContainer()
	if ec.GetTargetContainerName() != "app" || c.GetName() != "debugger" || c.GetImage() != "busybox:1.36" ||
		c.GetImagePullPolicy() != runtimev1.PullPolicy_PULL_POLICY_IF_NOT_PRESENT ||
		len(c.GetCommand()) != 1 || c.GetCommand()[0] != "sh" || len(c.GetArgs()) != 2 || c.GetWorkingDir() != "/tmp" ||
		!c.GetStdin() || !c.GetTty() {
		t.Fatalf("translated: %v", ec)
	}
	env := map[string]string{}
	for _, e := range c.GetEnv() {
		env[e.GetName()] = e.GetValue()
	}
	if env["A"] != "1" || env["POD"] != "web" {
		t.Errorf("env %v", c.GetEnv())
	}
	if vm := c.GetVolumeMounts(); len(vm) != 1 || vm[0].GetName() != "data" || vm[0].GetMountPath() != "/mnt/data" || !vm[0].GetReadOnly() {
		t.Errorf("volume mounts %v", vm)
	}
	if len(failed) != 1 || failed[0] != `broken: configmap "missing" not found` {
		t.Errorf("failures reported: %q", failed)
	}
}

// A pod name longer than a hostname may be is cut to 63 bytes without a
// trailing '-', as the kubelet does; the kernel refuses longer ones.
func TestLongPodNameHostname(t *testing.T) {
	long := "pod-update-activedeadlineseconds-376444b8-2843-466c-a4ca-bb6a98d3754d"
	for name, want := range map[string]string{
		"short":                        "short",
		long:                           "pod-update-activedeadlineseconds-376444b8-2843-466c-a4ca-bb6a98",
		strings.Repeat("a", 62) + "-b": strings.Repeat("a", 62),
	} {
		if got := truncateHostname(name); got != want || len(got) > 63 {
			t.Errorf("truncateHostname(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestHostAliasesTranslate(t *testing.T) {
	pod := apiPod(func(p *corev1.Pod) {
		p.Spec.HostAliases = []corev1.HostAlias{{IP: "123.45.67.89", Hostnames: []string{"foo", "bar"}}}
	})
	spec, err := (&Translator{src: tableSource()}).PodSpec(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.HostAliases) != 1 || spec.HostAliases[0].Ip != "123.45.67.89" || strings.Join(spec.HostAliases[0].Hostnames, ",") != "foo,bar" {
		t.Errorf("host aliases: %v", spec.HostAliases)
	}
}
