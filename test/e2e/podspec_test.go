package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestPodSpecSurface covers what the node resolves from a Pod spec: env and
// its valueFrom sources, workingDir, image pull secrets and pull policies,
// and kubectl logs' streaming options.
func TestPodSpecSurface(t *testing.T) {
	imgs := buildImages(t)
	private := imagetest.StartRegistry(t, "puller", "s3cret")
	img := progImage(t)
	privateRef := private.Push(t, "private:v1", img, remote.WithAuth(&authn.Basic{Username: "puller", Password: "s3cret"}))

	s := newServer(t)
	s.start()
	c := s.client()
	cx := ctx(t)

	t.Run("env, valueFrom and workingDir", func(t *testing.T) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"color": "blue", "size": "9"}}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"}, StringData: map[string]string{"token": "t0k3n"}}
		if _, err := c.CoreV1().ConfigMaps("default").Create(cx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Secrets("default").Create(cx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := nativePod("envs", imgs.prog, "env:PLAIN", "env:EXPANDED", "env:COLOR", "env:TOKEN", "env:POD", "env:NS", "env:NODE",
			"env:LABEL", "env:MEM", "env:CFG_size", "pwd", "forever")
		ctr := &p.Spec.Containers[0]
		ctr.WorkingDir = "/app"
		ctr.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
		ctr.EnvFrom = []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}
		ctr.Env = []corev1.EnvVar{
			{Name: "PLAIN", Value: "plain-value"},
			{Name: "EXPANDED", Value: "$(PLAIN)-expanded"},
			{Name: "COLOR", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "color"}}},
			{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "token"}}},
			{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "LABEL", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['test']"}}},
			{Name: "MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
		}
		if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "envs", time.Minute, running)
		want := []string{"PLAIN=plain-value", "EXPANDED=plain-value-expanded", "COLOR=blue", "TOKEN=t0k3n", "POD=envs",
			"NS=default", "NODE=e2e-node", "LABEL=envs", "MEM=64", "CFG_size=9", "pwd=/"}
		waitFor(t, 30*time.Second, "env in logs", func() error {
			out, err := s.kubectl("logs", "envs")
			if err != nil {
				return err
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					return fmt.Errorf("missing %q in:\n%s", w, out)
				}
			}
			// workingDir /app is the image's own /app (the pod's "/").
			if !strings.Contains(out, "pwd=/app\n") {
				return fmt.Errorf("workingDir not inside the pod root:\n%s", out)
			}
			return nil
		})
	})

	t.Run("missing configMap is CreateContainerConfigError", func(t *testing.T) {
		p := nativePod("needs-cm", imgs.prog)
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "later"}, Key: "x"}}}}
		if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "needs-cm", time.Minute, func(p *corev1.Pod) error {
			if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
				p.Status.ContainerStatuses[0].State.Waiting.Reason == "CreateContainerConfigError" {
				return nil
			}
			return fmt.Errorf("status %+v", p.Status.ContainerStatuses)
		})
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "later"}, Data: map[string]string{"x": "1"}}
		if _, err := c.CoreV1().ConfigMaps("default").Create(cx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "needs-cm", time.Minute, running) // retried, as the kubelet does
	})

	t.Run("imagePullSecrets", func(t *testing.T) {
		auth := base64.StdEncoding.EncodeToString([]byte("puller:s3cret"))
		cfg, _ := json.Marshal(map[string]any{"auths": map[string]any{private.Host: map[string]string{"auth": auth}}})
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pull"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: cfg}}
		if _, err := c.CoreV1().Secrets("default").Create(cx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The pull without the secret first: once the image is in the store,
		// a pod with pull policy IfNotPresent runs it without pulling, as on
		// a kubelet, so the two pods at once raced.
		without := nativePod("no-secret", privateRef)
		if _, err := c.CoreV1().Pods("default").Create(cx, without, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "no-secret", time.Minute, func(p *corev1.Pod) error {
			if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil {
				if r := p.Status.ContainerStatuses[0].State.Waiting.Reason; r == "ErrImagePull" || r == "ImagePullBackOff" {
					return nil
				}
			}
			return fmt.Errorf("status %+v", p.Status.ContainerStatuses)
		})
		with := nativePod("with-secret", privateRef)
		with.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "pull"}}
		if _, err := c.CoreV1().Pods("default").Create(cx, with, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "with-secret", time.Minute, running)
	})

	t.Run("imagePullPolicy Never", func(t *testing.T) {
		p := nativePod("never", imgs.prog+"-absent")
		p.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
		if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "never", time.Minute, func(p *corev1.Pod) error {
			if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
				p.Status.ContainerStatuses[0].State.Waiting.Reason == "ErrImageNeverPull" {
				return nil
			}
			return fmt.Errorf("status %+v", p.Status.ContainerStatuses)
		})
	})

	t.Run("logs -f and --since", func(t *testing.T) {
		p := nativePod("ticker", imgs.prog, "echo:first", "sleep:1500ms", "echo:second", "forever")
		p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
		if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "ticker", time.Minute, running)
		fctx, cancel := context.WithTimeout(cx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(fctx, k3smBin, "kubectl", "--kubeconfig", s.kubeconfig(), "logs", "-f", "ticker")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		var lines []string
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if sc.Text() == "second" {
				break
			}
		}
		cancel()
		cmd.Wait()
		if len(lines) < 2 || lines[0] != "first" || lines[len(lines)-1] != "second" {
			t.Fatalf("logs -f saw %q", lines)
		}
		if out, err := s.kubectl("logs", "ticker", "--since=1h"); err != nil || !strings.Contains(out, "first") {
			t.Fatalf("--since=1h: %v %s", err, out)
		}
		time.Sleep(1200 * time.Millisecond)
		if out, err := s.kubectl("logs", "ticker", "--since=1s"); err != nil || strings.Contains(out, "first") {
			t.Fatalf("--since=1s should not include old lines: %v %q", err, out)
		}
	})
}
