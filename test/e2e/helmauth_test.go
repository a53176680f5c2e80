package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/charttest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// TestHelmChartPrivateSources: HelmCharts from a chart repository and an
// OCI registry the test serves on 127.0.0.1 over TLS with a CA of its own
// and basic auth. Each missing piece fails with a status and an Event that
// name the field to set; with spec.repoCAConfigMap/repoCA, spec.authSecret
// and spec.dockerRegistrySecret the charts install.
func TestHelmChartPrivateSources(t *testing.T) {
	s := newServer(t)
	s.start()
	c := s.client()
	dyn, err := dynamic.NewForConfig(s.restConfig())
	if err != nil {
		t.Fatal(err)
	}
	ri := dyn.Resource(helmChartGVR).Namespace("kube-system")
	ca := charttest.NewCA(t)
	patchSpec := func(t *testing.T, name string, spec map[string]any) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"spec": spec})
		if _, err := ri.Patch(ctx(t), name, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("repo-basic-auth-private-ca", func(t *testing.T) {
		repo := charttest.Repo(t, ca, "alice", "s3cret", "privrepo", "1.0.0")
		hc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
			"metadata": map[string]any{"name": "privrepo", "namespace": "kube-system"},
			"spec": map[string]any{"repo": repo.URL, "chart": "privrepo", "targetNamespace": "default",
				"set": map[string]any{"greeting": "from-private-repo"}},
		}}
		if _, err := ri.Create(ctx(t), hc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the unknown CA on the status", chartFailed(t, dyn, "privrepo", "unknown authority", "set spec.repoCA"))
		waitFor(t, 10*time.Second, "the unknown CA as an Event", chartEvent(t, c, "privrepo", "set spec.repoCA"))

		if _, err := c.CoreV1().ConfigMaps("kube-system").Create(ctx(t), &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "privrepo-ca"}, Data: map[string]string{"ca.crt": string(ca.PEM)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		patchSpec(t, "privrepo", map[string]any{"repoCAConfigMap": map[string]any{"name": "privrepo-ca"}})
		waitFor(t, time.Minute, "the 401 on the status", chartFailed(t, dyn, "privrepo", "401 Unauthorized", "set spec.authSecret"))
		waitFor(t, 10*time.Second, "the 401 as an Event", chartEvent(t, c, "privrepo", "set spec.authSecret"))

		// A Secret that is not there yet is named with the command that makes it.
		patchSpec(t, "privrepo", map[string]any{"authSecret": map[string]any{"name": "privrepo-auth"}})
		waitFor(t, time.Minute, "the missing Secret on the status", chartFailed(t, dyn, "privrepo", "spec.authSecret: Secret kube-system/privrepo-auth not found", "kubectl create secret generic privrepo-auth"))
		if _, err := c.CoreV1().Secrets("kube-system").Create(ctx(t), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "privrepo-auth"}, Type: corev1.SecretTypeBasicAuth,
			StringData: map[string]string{"username": "alice", "password": "s3cret"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Retried with backoff (at most 2 min); a touch of the spec retries now.
		patchSpec(t, "privrepo", map[string]any{"timeout": "2m"})
		waitFor(t, 2*time.Minute, "the private repo chart's ConfigMap", configMapValue(c, t, "default", "privrepo-greeting", "greeting", "from-private-repo"))
		// The back-off's retry may install the previous generation just
		// before the touch lands; the touched spec is then upgraded to, as
		// any spec change is: revision 1 or 2, Ready at the latest generation.
		waitFor(t, 30*time.Second, "HelmChart privrepo status", chartStatusLatest(t, dyn, "privrepo", 1, 2))
	})

	t.Run("oci-docker-registry-secret", func(t *testing.T) {
		_, host := charttest.Registry(t, ca, "carol", "pa55", "privoci", "0.4.0")
		hc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
			"metadata": map[string]any{"name": "privoci", "namespace": "kube-system"},
			"spec": map[string]any{"chart": "oci://" + host + "/charts/privoci", "repoCA": string(ca.PEM),
				"targetNamespace": "default", "valuesContent": "greeting: from-private-oci\n"},
		}}
		if _, err := ri.Create(ctx(t), hc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the missing credentials on the status", chartFailed(t, dyn, "privoci", "set spec.dockerRegistrySecret"))
		waitFor(t, 10*time.Second, "the missing credentials as an Event", chartEvent(t, c, "privoci", "set spec.dockerRegistrySecret"))

		cfg, _ := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{"username": "carol", "password": "pa55"}}})
		if _, err := c.CoreV1().Secrets("kube-system").Create(ctx(t), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "privoci-pull"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: cfg}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		patchSpec(t, "privoci", map[string]any{"dockerRegistrySecret": map[string]any{"name": "privoci-pull"}})
		waitFor(t, 2*time.Minute, "the private OCI chart's ConfigMap", configMapValue(c, t, "default", "privoci-greeting", "greeting", "from-private-oci"))
		waitFor(t, 30*time.Second, "HelmChart privoci status", chartStatus(t, dyn, "privoci", 1))
	})
}

// chartFailed wants the HelmChart's Failed condition to say every part.
func chartFailed(t *testing.T, dyn dynamic.Interface, name string, parts ...string) func() error {
	return func() error {
		hc, err := dyn.Resource(helmChartGVR).Namespace("kube-system").Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(hc.Object, "status", "conditions")
		for _, c := range conds {
			m, ok := c.(map[string]any)
			if !ok || m["type"] != "Failed" || m["status"] != "True" {
				continue
			}
			msg := fmt.Sprint(m["message"])
			for _, p := range parts {
				if !strings.Contains(msg, p) {
					return fmt.Errorf("Failed message %q does not say %q", msg, p)
				}
			}
			return nil
		}
		return fmt.Errorf("no Failed condition: status %v", hc.Object["status"])
	}
}

// chartEvent wants a Warning Event on the HelmChart whose message says part.
func chartEvent(t *testing.T, c kubernetes.Interface, name, part string) func() error {
	return func() error {
		evs, err := c.CoreV1().Events("kube-system").List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.kind=HelmChart,involvedObject.name=" + name})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, part) {
				return nil
			}
		}
		return fmt.Errorf("no Warning Event on HelmChart %s saying %q among %d", name, part, len(evs.Items))
	}
}
