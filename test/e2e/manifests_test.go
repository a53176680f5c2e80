package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const providerTaint = "k3sm.io/provider"

// A Linux node runs standard manifests unchanged: a Deployment made as
// `kubectl create deployment` makes it (no nodeSelector, no toleration)
// becomes available, also from an image whose config names no platform (as
// `crane append` makes them); a pod asking for another OS is refused at
// admission with the field named; --node-taint puts the provider taint on
// the existing Node.
func TestStandardManifests(t *testing.T) {
	reg := imagetest.StartRegistry(t, "", "")
	img := progImage(t)
	bare := variant(t, img, func(cf *v1.ConfigFile) { cf.OS, cf.Architecture = "", "" })
	webImage, bareImage := reg.Push(t, "web:v1", img), reg.Push(t, "bare:v1", bare)

	s := newServer(t)
	s.start()
	c := s.client()

	t.Run("node is not tainted", func(t *testing.T) {
		n, err := c.CoreV1().Nodes().Get(ctx(t), "e2e-node", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(n.Spec.Taints, func(tn corev1.Taint) bool { return tn.Key == providerTaint }) {
			t.Fatalf("taints %v: the provider taint is opt-in on linux", n.Spec.Taints)
		}
	})

	available := func(t *testing.T, name string) {
		t.Helper()
		waitFor(t, 2*time.Minute, "deployment "+name+" available", func() error {
			d, err := c.AppsV1().Deployments("default").Get(ctx(t), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range d.Status.Conditions {
				if cond.Type == appsv1.DeploymentAvailable && cond.Status == corev1.ConditionTrue && d.Status.AvailableReplicas == 1 {
					return nil
				}
			}
			pods, _ := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{LabelSelector: "app=" + name})
			var states []string
			for _, p := range pods.Items {
				states = append(states, fmt.Sprintf("%s %s %v %v", p.Name, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses))
			}
			return fmt.Errorf("conditions %v; pods %v", d.Status.Conditions, states)
		})
		pods, err := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("pods %v %v", len(pods.Items), err)
		}
		p := pods.Items[0]
		if p.Status.Phase != corev1.PodRunning || p.Spec.NodeName != "e2e-node" {
			t.Fatalf("pod %s: %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName)
		}
		// What kubectl made, unchanged: nothing selects an OS or tolerates the provider.
		if len(p.Spec.NodeSelector) != 0 || p.Spec.OS != nil || p.Spec.Affinity != nil ||
			slices.ContainsFunc(p.Spec.Tolerations, func(tl corev1.Toleration) bool {
				return tl.Key == providerTaint || tl.Operator == corev1.TolerationOpExists && tl.Key == ""
			}) {
			t.Fatalf("pod spec was given a selector or toleration: %+v %+v %v", p.Spec.NodeSelector, p.Spec.OS, p.Spec.Tolerations)
		}
	}

	t.Run("kubectl create deployment runs unchanged", func(t *testing.T) {
		if out, err := s.kubectl("create", "deployment", "web", "--image="+webImage); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		available(t, "web")
	})

	t.Run("image whose config names no platform runs", func(t *testing.T) {
		if out, err := s.kubectl("create", "deployment", "bare", "--image="+bareImage); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		available(t, "bare")
	})

	refused := func(t *testing.T, name, spec, want string) {
		t.Helper()
		file := filepath.Join(t.TempDir(), name+".yaml")
		manifest := fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\nspec:\n%s  containers:\n  - name: main\n    image: %s\n", name, spec, webImage)
		if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := s.kubectl("create", "-f", file)
		if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "k3sm-pods-select-node-os") {
			t.Fatalf("want a refusal with %q, got %v:\n%s", want, err, out)
		}
		t.Logf("refused: %s", strings.TrimSpace(out))
	}
	t.Run("nodeSelector for windows is refused", func(t *testing.T) {
		refused(t, "win-selector", "  nodeSelector:\n    kubernetes.io/os: windows\n",
			"spec.nodeSelector['kubernetes.io/os'] is windows, but k3sm runs this node's pods as native linux processes: remove it or set it to linux")
	})
	t.Run("spec.os.name windows is refused", func(t *testing.T) {
		refused(t, "win-os", "  os:\n    name: windows\n",
			"spec.os.name is windows, but k3sm runs this node's pods as native linux processes: remove spec.os or set spec.os.name: linux")
	})
	t.Run("required node affinity for windows is refused", func(t *testing.T) {
		refused(t, "win-affinity", `  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - {key: kubernetes.io/os, operator: In, values: [windows]}
`, "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution asks for a kubernetes.io/os other than linux")
	})

	// Restarted with --node-taint, the server taints the Node it kept (the
	// node may not change its own taints): new pods without a toleration
	// stay Pending, running ones stay.
	t.Run("--node-taint taints the existing node", func(t *testing.T) {
		s.stop()
		s.extra = append(s.extra, "--node-taint")
		s.start()
		c := s.client()
		n, err := c.CoreV1().Nodes().Get(ctx(t), "e2e-node", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(n.Spec.Taints, func(tn corev1.Taint) bool {
			return tn.Key == providerTaint && tn.Value == "native" && tn.Effect == corev1.TaintEffectNoSchedule
		}) {
			t.Fatalf("taints %v lack %s=native:NoSchedule", n.Spec.Taints, providerTaint)
		}
		if out, err := s.kubectl("run", "untolerated", "--image="+webImage, "--restart=Never"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		waitFor(t, time.Minute, "untolerated pod unschedulable", func() error {
			p, err := c.CoreV1().Pods("default").Get(ctx(t), "untolerated", metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && strings.Contains(cond.Message, "untolerated taint") {
					return nil
				}
			}
			return fmt.Errorf("phase %s on %q, conditions %v", p.Status.Phase, p.Spec.NodeName, p.Status.Conditions)
		})
		available(t, "web")
	})
}
