package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// buildInCluster packs test/e2e/incluster (client-go with
// rest.InClusterConfig) as an image in a registry on 127.0.0.1.
func buildInCluster(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "incluster")
	cmd := exec.Command("go", "build", "-o", bin, "./incluster")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build incluster: %v\n%s", err, out)
	}
	img, err := imagetest.Image(bin, v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	return imagetest.StartRegistry(t, "", "").Push(t, "incluster:v1", img)
}

// execIn runs a command in a pod's container through kubectl exec.
func (s *server) execIn(pod, container string, cmd ...string) (string, error) {
	out, err := s.kubectlCmd(append([]string{"exec", pod, "-c", container, "--"}, cmd...)...).CombinedOutput()
	return string(out), err
}

func TestVolumes(t *testing.T) {
	imgs := buildImages(t)
	incluster := buildInCluster(t)
	s := newServer(t)
	s.start()
	c := s.client()
	create := s.createPod
	del := func(t *testing.T, name string) { t.Helper(); s.deletePod(t, name, 0) }
	mustExec := func(t *testing.T, pod, ctr string, cmd ...string) string {
		t.Helper()
		out, err := s.execIn(pod, ctr, cmd...)
		if err != nil {
			t.Fatalf("exec %v in %s/%s: %v\n%s", cmd, pod, ctr, err, out)
		}
		return out
	}

	// configMap, secret, downwardAPI and emptyDir volumes appear at their
	// mountPath inside the pod only; a configMap update reaches the running
	// pod atomically; emptyDir is shared by the pod's containers.
	t.Run("configMap secret downwardAPI emptyDir", func(t *testing.T) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app-config"}, Data: map[string]string{"greeting": "hello v1", "other": "x"}}
		if _, err := c.CoreV1().ConfigMaps("default").Create(ctx(t), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-secret"}, Data: map[string][]byte{"password": []byte("s3cret")}}
		if _, err := c.CoreV1().Secrets("default").Create(ctx(t), sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// None of these paths exist on the host, and none may appear there.
		const cfgDir, secDir, infoDir, scratch = "/etc/k3sm-e2e/config", "/k3sm-e2e-secret", "/var/run/k3sm-e2e/podinfo", "/scratch"
		p := nativePod("vols", imgs.prog, "forever")
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
			{Name: "config", MountPath: cfgDir}, {Name: "secret", MountPath: secDir},
			{Name: "info", MountPath: infoDir}, {Name: "scratch", MountPath: scratch},
			{Name: "config", MountPath: "/etc/k3sm-e2e-app.conf", SubPath: "greeting.txt"}}
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "second", Image: imgs.prog, Args: []string{"forever"},
			VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/data/shared"}}})
		p.Spec.Volumes = []corev1.Volume{
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}, DefaultMode: ptr.To[int32](0o440),
				Items: []corev1.KeyToPath{{Key: "greeting", Path: "greeting.txt"}}}}},
			{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "app-secret"}}},
			{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
				{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		}
		create(t, p)
		waitPod(t, c, p.Name, 2*time.Minute, running)

		if got := mustExec(t, p.Name, "main", "cat", cfgDir+"/greeting.txt"); got != "hello v1" {
			t.Errorf("configMap file: %q", got)
		}
		if got := mustExec(t, p.Name, "main", "cat", "/etc/k3sm-e2e-app.conf"); got != "hello v1" {
			t.Errorf("subPath file mount: %q", got)
		}
		if got := mustExec(t, p.Name, "main", "stat", "-L", "-c", "%a", cfgDir+"/greeting.txt"); strings.TrimSpace(got) != "440" {
			t.Errorf("defaultMode: %q", got)
		}
		if out, err := s.execIn(p.Name, "main", "cat", cfgDir+"/other"); err == nil {
			t.Errorf("a key not in items is visible: %q", out)
		}
		if got := mustExec(t, p.Name, "main", "cat", secDir+"/password"); got != "s3cret" {
			t.Errorf("secret file: %q", got)
		}
		if got := mustExec(t, p.Name, "main", "cat", infoDir+"/name"); got != "vols" {
			t.Errorf("downwardAPI name: %q", got)
		}
		if got := mustExec(t, p.Name, "main", "cat", infoDir+"/labels"); got != `test="vols"` {
			t.Errorf("downwardAPI labels: %q", got)
		}
		if out, err := s.execIn(p.Name, "main", "sh", "-c", "echo x > "+cfgDir+"/new"); err == nil {
			t.Errorf("configMap volume is writable: %q", out)
		}
		// The service account token the admission plugin projects.
		if got := mustExec(t, p.Name, "main", "cat", "/var/run/secrets/kubernetes.io/serviceaccount/namespace"); got != "default" {
			t.Errorf("service account namespace file: %q", got)
		}
		// emptyDir: written by one container, read by the other.
		mustExec(t, p.Name, "main", "sh", "-c", "echo shared-data > "+scratch+"/f")
		if got := mustExec(t, p.Name, "second", "cat", "/data/shared/f"); got != "shared-data\n" {
			t.Errorf("emptyDir in the second container: %q", got)
		}
		// Nothing on the host; and a container without the mount does not see it.
		for _, h := range []string{"/etc/k3sm-e2e", "/etc/k3sm-e2e-app.conf", secDir, "/var/run/k3sm-e2e", scratch, "/data/shared"} {
			if _, err := os.Stat(h); err == nil {
				t.Errorf("%s exists on the host", h)
			}
		}
		if out, err := s.execIn(p.Name, "second", "cat", cfgDir+"/greeting.txt"); err == nil {
			t.Errorf("the second container sees the first one's configMap: %q", out)
		}

		// An update appears in the running pod, all files at once.
		cm.Data["greeting"] = "hello v2"
		if _, err := c.CoreV1().ConfigMaps("default").Update(ctx(t), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitFor(t, time.Minute, "configMap update in the pod", func() error {
			got, err := s.execIn(p.Name, "main", "cat", cfgDir+"/greeting.txt")
			if err != nil || got != "hello v2" {
				return fmt.Errorf("%q %v", got, err)
			}
			return nil
		})
		t.Logf("configMap update visible in the pod after %s", time.Since(start).Round(100*time.Millisecond))
		// A label change reaches the downwardAPI file.
		lp := []byte(`{"metadata":{"labels":{"extra":"yes"}}}`)
		if _, err := c.CoreV1().Pods("default").Patch(ctx(t), p.Name, "application/strategic-merge-patch+json", lp, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "label in the downwardAPI file", func() error {
			got, err := s.execIn(p.Name, "main", "cat", infoDir+"/labels")
			if err != nil || got != "extra=\"yes\"\ntest=\"vols\"" {
				return fmt.Errorf("%q %v", got, err)
			}
			return nil
		})
		del(t, p.Name)
	})

	// An emptyDir above its sizeLimit gets the pod evicted, as with the
	// kubelet: Failed, reason Evicted, containers stopped.
	t.Run("emptyDir sizeLimit", func(t *testing.T) {
		p := nativePod("evict-me", "native")
		p.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "dd if=/dev/zero of=/cache/big bs=1024 count=2048 2>/dev/null; sleep 600"}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}}
		p.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			SizeLimit: ptr.To(resource.MustParse("1Mi"))}}}}
		create(t, p)
		pod := waitPod(t, c, p.Name, time.Minute, func(p *corev1.Pod) error {
			if p.Status.Phase != corev1.PodFailed || p.Status.Reason != "Evicted" {
				return fmt.Errorf("phase %s reason %q", p.Status.Phase, p.Status.Reason)
			}
			if cs := ctrStatus(p, "main"); cs == nil || cs.State.Terminated == nil {
				return fmt.Errorf("container still %+v", cs)
			}
			return nil
		})
		if want := `Usage of EmptyDir volume "cache" exceeds the limit "1Mi". `; pod.Status.Message != want {
			t.Errorf("message %q, want %q", pod.Status.Message, want)
		}
		waitEvent(t, c, p.Name, "Evicted", "exceeds the limit")
		del(t, p.Name)
	})

	// hostPath: allowed outside k3sm's data dir, refused inside it with a
	// FailedMount event that names the rule.
	t.Run("hostPath rule", func(t *testing.T) {
		hostDir := t.TempDir()
		os.WriteFile(filepath.Join(hostDir, "f"), []byte("from the host"), 0o644)
		ok := nativePod("hostpath-ok", imgs.prog, "forever")
		ok.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "h", MountPath: "/host-data"}}
		ok.Spec.Volumes = []corev1.Volume{{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir,
			Type: ptr.To(corev1.HostPathDirectory)}}}}
		bad := nativePod("hostpath-refused", imgs.prog, "forever")
		bad.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "h", MountPath: "/stolen"}}
		bad.Spec.Volumes = []corev1.Volume{{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: filepath.Join(s.dataDir, "server")}}}}
		create(t, ok)
		create(t, bad)
		waitPod(t, c, ok.Name, 2*time.Minute, running)
		if got := mustExec(t, ok.Name, "main", "cat", "/host-data/f"); got != "from the host" {
			t.Errorf("hostPath file: %q", got)
		}
		e := waitEvent(t, c, bad.Name, "FailedMount", "is refused")
		if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, "data directory") {
			t.Errorf("FailedMount event: %s %q", e.Type, e.Message)
		}
		if p, _ := c.CoreV1().Pods("default").Get(ctx(t), bad.Name, metav1.GetOptions{}); p.Status.Phase != corev1.PodPending {
			t.Errorf("refused hostPath pod is %s", p.Status.Phase)
		}
		del(t, ok.Name)
		del(t, bad.Name)
	})

	// A PVC of the default StorageClass (the built-in local-path
	// provisioner) keeps its data across pod deletion and recreation, and
	// its directory goes with the claim.
	t.Run("persistentVolumeClaim", func(t *testing.T) {
		sc, err := c.StorageV1().StorageClasses().Get(ctx(t), "local-path", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" || sc.VolumeBindingMode == nil ||
			*sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
			t.Errorf("StorageClass local-path: %+v", sc)
		}
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data"}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
		if _, err := c.CoreV1().PersistentVolumeClaims("default").Create(ctx(t), pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		podNamed := func(name string) *corev1.Pod {
			p := nativePod(name, imgs.prog, "forever")
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/k3sm-e2e-data"}}
			p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}
			uid := int64(1000)
			p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &uid}
			return p
		}
		pod := func() *corev1.Pod { return podNamed("pvc-user") }
		create(t, pod())
		waitPod(t, c, "pvc-user", 2*time.Minute, running)
		// A file only its owner may read: another pod of the same user,
		// whose id range differs, must still be its owner (the volume is
		// idmapped, so the file is uid 1000 on disk, as the pods see it).
		// The peer is an `image: native` pod: its volumes are mounted on
		// the host's view, the other way in.
		mustExec(t, "pvc-user", "main", "sh", "-c", "umask 077 && echo persisted > /var/lib/k3sm-e2e-data/file")
		peer := podNamed("pvc-peer")
		peer.Spec.Containers[0].Image, peer.Spec.Containers[0].Args = "native", []string{"/bin/sleep", "infinity"}
		create(t, peer)
		waitPod(t, c, "pvc-peer", 2*time.Minute, running)
		if out, err := s.execIn("pvc-peer", "main", "sh", "-c", "cat /var/lib/k3sm-e2e-data/file && echo peer >> /var/lib/k3sm-e2e-data/file"); err != nil || out != "persisted\n" {
			t.Errorf("a second pod of uid 1000 reading and appending to the first pod's 0600 file: %v %q", err, out)
		}
		del(t, "pvc-peer")
		bound, err := c.CoreV1().PersistentVolumeClaims("default").Get(ctx(t), "data", metav1.GetOptions{})
		if err != nil || bound.Status.Phase != corev1.ClaimBound {
			t.Fatalf("claim %v: %v", bound.Status.Phase, err)
		}
		pv, err := c.CoreV1().PersistentVolumes().Get(ctx(t), bound.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Spec.HostPath == nil {
			t.Fatalf("pv %+v: %v", pv, err)
		}
		if !strings.HasPrefix(pv.Spec.HostPath.Path, filepath.Join(s.dataDir, "storage")+"/") {
			t.Errorf("volume directory %s is not under the data dir's storage/", pv.Spec.HostPath.Path)
		}
		if fi, err := os.Stat(filepath.Join(pv.Spec.HostPath.Path, "file")); err != nil {
			t.Error(err)
		} else if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 || fi.Mode().Perm() != 0o600 {
			t.Errorf("the pod's file is %d:%d %v on disk, want 1000:1000 -rw-------", st.Uid, st.Gid, fi.Mode())
		}
		del(t, "pvc-user")
		create(t, pod())
		waitPod(t, c, "pvc-user", 2*time.Minute, running)
		if got := mustExec(t, "pvc-user", "main", "cat", "/var/lib/k3sm-e2e-data/file"); got != "persisted\npeer\n" {
			t.Errorf("data after the pod was recreated: %q", got)
		}
		// The same name and spec right after a force delete: the old pod's
		// process is gone, only the new one runs.
		waitFor(t, 30*time.Second, "one workload process", func() error {
			if pids := s.workloadPids(); len(pids) != 1 {
				return fmt.Errorf("workload processes %v", pids)
			}
			return nil
		})
		del(t, "pvc-user")
		if err := c.CoreV1().PersistentVolumeClaims("default").Delete(ctx(t), "data", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "volume reclaimed", func() error {
			if _, err := c.CoreV1().PersistentVolumes().Get(ctx(t), pv.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("PV still there (%v)", err)
			}
			if _, err := os.Stat(pv.Spec.HostPath.Path); !os.IsNotExist(err) {
				return fmt.Errorf("directory still there (%v)", err)
			}
			return nil
		})
	})

	// An unmodified client-go program with rest.InClusterConfig() lists
	// pods with its service account's permissions; without RBAC it is denied.
	t.Run("in-cluster client", func(t *testing.T) {
		for _, sa := range []string{"lister", "nobody"} {
			if _, err := c.CoreV1().ServiceAccounts("default").Create(ctx(t), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-lister"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}}}
		if _, err := c.RbacV1().Roles("default").Create(ctx(t), role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pod-lister"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pod-lister"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "lister", Namespace: "default"}}}
		if _, err := c.RbacV1().RoleBindings("default").Create(ctx(t), rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			sa    string
			phase corev1.PodPhase
			log   string
		}{
			{"lister", corev1.PodSucceeded, "listed "},
			{"nobody", corev1.PodFailed, `cannot list resource "pods"`},
		} {
			p := nativePod("client-"+tc.sa, incluster)
			p.Spec.ServiceAccountName = tc.sa
			p.Spec.RestartPolicy = corev1.RestartPolicyNever
			create(t, p)
			waitPod(t, c, p.Name, 2*time.Minute, func(p *corev1.Pod) error {
				if p.Status.Phase != tc.phase {
					return fmt.Errorf("phase %s: %+v", p.Status.Phase, p.Status.ContainerStatuses)
				}
				return nil
			})
			logs, err := s.kubectl("logs", p.Name)
			if err != nil || !strings.Contains(logs, tc.log) {
				t.Errorf("%s: logs %q (%v), want %q", tc.sa, logs, err, tc.log)
			}
			t.Logf("%s: %s", tc.sa, strings.TrimSpace(logs))
			if tc.sa == "lister" && os.Geteuid() == 0 && os.Getenv(inNetNSEnv) != "" {
				// With a pod network the program reaches the API through
				// the kubernetes Service, as upstream: the env names its
				// ClusterIP (without one, the API's own address).
				api, err := c.CoreV1().Services("default").Get(ctx(t), "kubernetes", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				want := " as https://" + net.JoinHostPort(api.Spec.ClusterIP, "443")
				if !strings.HasSuffix(strings.TrimSpace(logs), want) {
					t.Errorf("rest.InClusterConfig().Host: logs %q, want them to end with %q", logs, want)
				}
			}
			del(t, p.Name)
		}
	})
}
