package podspec

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func volPod(vols ...corev1.Volume) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1", Labels: map[string]string{"b": "2", "a": "x\"y"}},
		Spec: corev1.PodSpec{ServiceAccountName: "sa", Volumes: vols, Containers: []corev1.Container{{Name: "c",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}}}}},
	}
}

func filesOf(t *testing.T, v *runtimev1.Volume) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range v.GetFiles().GetFiles() {
		out[f.GetPath()] = fmt.Sprintf("%s|%04o", f.GetContent(), f.GetMode())
	}
	return out
}

func TestVolumesFiles(t *testing.T) {
	tokens := 0
	src := fakeSource{
		cms:     map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"a": "1", "b": "2"}, BinaryData: map[string][]byte{"bin": {0, 1}}}},
		secrets: map[string]*corev1.Secret{"s": {Data: map[string][]byte{"k": []byte("secret")}}},
		tokens:  &tokens,
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := &Translator{src: src, tokens: &tokenCache{}, now: func() time.Time { return now }}
	pod := volPod(
		corev1.Volume{Name: "all", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}},
		corev1.Volume{Name: "items", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, DefaultMode: ptr.To[int32](0o600),
			Items: []corev1.KeyToPath{{Key: "a", Path: "dir/first"}, {Key: "b", Path: "second", Mode: ptr.To[int32](0o400)}}}}},
		corev1.Volume{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s"}}},
		corev1.Volume{Name: "opt", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "missing", Optional: ptr.To(true)}}},
		corev1.Volume{Name: "down", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
			{Path: "mem", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "c", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}},
		}}}},
		corev1.Volume{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](0o644),
			Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3600)}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Items: []corev1.KeyToPath{{Key: "a", Path: "ca.crt"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
			}}}},
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("1Mi"))}}},
	)
	vols, err := tr.volumes(context.Background(), pod, false)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]string{}
	for _, v := range vols {
		got[v.GetName()] = filesOf(t, v)
	}
	want := map[string]map[string]string{
		"all":             {"a": "1|0644", "b": "2|0644", "bin": "\x00\x01|0644"},
		"items":           {"dir/first": "1|0600", "second": "2|0400"},
		"sec":             {"k": "secret|0644"},
		"opt":             {},
		"down":            {"labels": "a=\"x\\\"y\"\nb=\"2\"|0644", "name": "p|0644", "mem": "64|0644"},
		"kube-api-access": {"token": "token-1|0644", "ca.crt": "1|0644", "namespace": "ns|0644"},
		"scratch":         {},
	}
	for name, w := range want {
		g := got[name]
		if len(g) != len(w) {
			t.Errorf("volume %s: got %v, want %v", name, g, w)
			continue
		}
		for k, v := range w {
			if g[k] != v {
				t.Errorf("volume %s file %s: got %q, want %q", name, k, g[k], v)
			}
		}
	}
	if ed := vols[len(vols)-1].GetEmptyDir(); ed == nil || ed.GetSizeLimitBytes() != 1<<20 {
		t.Errorf("emptyDir: %v", vols[len(vols)-1])
	}

	// The token is reused until 80% of its life has passed, then renewed.
	now = now.Add(47 * time.Minute)
	if _, err := tr.volumes(context.Background(), pod, true); err != nil || tokens != 1 {
		t.Fatalf("token requested again after 47 of 60 minutes (%d requests, %v)", tokens, err)
	}
	now = now.Add(2 * time.Minute)
	vols, err = tr.volumes(context.Background(), pod, true)
	if err != nil || tokens != 2 {
		t.Fatalf("token not refreshed after 49 of 60 minutes (%d requests, %v)", tokens, err)
	}
	for _, v := range vols {
		if v.GetName() == "scratch" {
			t.Error("filesOnly returned an emptyDir")
		}
	}
	tr.tokens.forget("uid-1")
	if len(tr.tokens.m) != 0 {
		t.Error("tokens kept after the pod was forgotten")
	}
}

func TestVolumesErrors(t *testing.T) {
	src := fakeSource{
		cms: map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"a": "1"}}},
		claims: map[string]*corev1.PersistentVolumeClaim{
			"pending": {Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}},
			"bound":   {Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-1"}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}},
		},
		pvs: map[string]*corev1.PersistentVolume{"pv-1": {Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/k3sm/storage/pvc-1", Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}}}},
	}
	tr := &Translator{src: src, protectedDirs: []string{"/var/lib/k3sm"}}
	cases := []struct {
		vol  corev1.VolumeSource
		want string // "" = no error
	}{
		{corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}}}, `configmap "nope" not found`},
		{corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"},
			Items: []corev1.KeyToPath{{Key: "zz", Path: "x"}}}}, "non-existent config key: zz"},
		{corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/k3sm/server"}}, "is refused"},
		{corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib"}}, "is refused"},
		{corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}, "is refused"},
		{corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/data"}}, ""},
		{corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "pending"}}, "not bound yet"},
		{corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "absent"}}, "not found"},
		{corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "bound"}}, ""},
		{corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "x", Path: "/"}}, "not supported"},
	}
	for _, c := range cases {
		pod := volPod(corev1.Volume{Name: "v", VolumeSource: c.vol})
		vols, err := tr.volumes(context.Background(), pod, false)
		if c.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", c.vol, err)
			}
			continue
		}
		var ve *VolumeError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `volume "v"`) {
			t.Errorf("%+v: got %v (%v), want a volumeError with %q", c.vol, err, vols, c.want)
		}
	}
	vols, err := tr.volumes(context.Background(), volPod(corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "bound"}}}), false)
	if err != nil || vols[0].GetHostPath().GetPath() != "/var/lib/k3sm/storage/pvc-1" || vols[0].GetHostPath().GetType() != "DirectoryOrCreate" {
		t.Errorf("bound claim: %v %v", vols, err)
	}
}

func TestAPIServerEnv(t *testing.T) {
	env := APIServerEnv("https://127.0.0.1:6443")(&corev1.Pod{})
	m := map[string]string{}
	for _, e := range env {
		m[e.Name] = e.Value
	}
	if m["KUBERNETES_SERVICE_HOST"] != "127.0.0.1" || m["KUBERNETES_SERVICE_PORT"] != "6443" || m["KUBERNETES_PORT_6443_TCP"] != "tcp://127.0.0.1:6443" {
		t.Errorf("env: %v", m)
	}
}

// countingSource counts the ConfigMap reads.
type countingSource struct {
	fakeSource
	reads *int
}

func (s countingSource) ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	*s.reads++
	return s.fakeSource.ConfigMap(ctx, ns, name)
}

// A refresh round resolves only files volumes and reads each ConfigMap once
// however many pods reference it; the next round reads it again.
func TestVolumeRefreshReadsEachObjectOnce(t *testing.T) {
	reads := 0
	tr := New(Config{Source: countingSource{fakeSource: fakeSource{cms: map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"a": "1"}}}}, reads: &reads}})
	cm := corev1.Volume{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}}
	scratch := corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	round := tr.NewVolumeRefresh()
	for _, uid := range []string{"u1", "u2", "u3"} {
		pod := volPod(cm, scratch)
		pod.UID = types.UID(uid)
		vols, err := round.FilesVolumes(context.Background(), pod)
		if err != nil || len(vols) != 1 || vols[0].GetName() != "cfg" || string(vols[0].GetFiles().GetFiles()[0].GetContent()) != "1" {
			t.Fatalf("%s: %v %v", uid, vols, err)
		}
	}
	if reads != 1 {
		t.Fatalf("%d reads of the ConfigMap in one round, want 1", reads)
	}
	if _, err := tr.NewVolumeRefresh().FilesVolumes(context.Background(), volPod(cm)); err != nil || reads != 2 {
		t.Fatalf("next round: %d reads, %v", reads, err)
	}
}
