package podspec

import (
	"context"
	"errors"
	"fmt"
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

type fakeSource struct {
	cms     map[string]*corev1.ConfigMap
	secrets map[string]*corev1.Secret
	claims  map[string]*corev1.PersistentVolumeClaim
	pvs     map[string]*corev1.PersistentVolume
	// tokens counts token requests; each returns "token-<n>".
	tokens *int
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
	tr := &Translator{src: src, nodeIP: "192.0.2.1"}
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
	want := map[string]string{"CM_a": "overridden", "CM_b": "2", "S": "secret", "LBL": "x", "IP": "192.0.2.1", "CPU": "1"}
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
	svc := func(string) []corev1.EnvVar {
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
