package e2e

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/deploy/charttest"
	helmregistry "helm.sh/helm/v3/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

var (
	helmChartGVR       = schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}
	helmChartConfigGVR = schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmchartconfigs"}
)

func writeManifest(t *testing.T, dir, name, content string) {
	t.Helper()
	// Written whole, then renamed: the folder is polled and must never see half a file.
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func configMapValue(c kubernetes.Interface, t *testing.T, ns, name, key, want string) func() error {
	return func() error {
		cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data[key] != want {
			return fmt.Errorf("%s/%s %s=%q, want %q", ns, name, key, cm.Data[key], want)
		}
		return nil
	}
}

func gone(err error, what string) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err == nil {
		return fmt.Errorf("%s still there", what)
	}
	return err
}

// TestDeployManifestsAndHelmCharts: the manifests folder applies, updates,
// restores deleted objects, honours .skip, reports bad YAML without
// stopping the rest; HelmCharts install from inline content and from an
// OCI registry (the latter dropped in the folder), upgrade on a values
// change (of the spec, a values Secret or the HelmChartConfig) and
// uninstall on deletion.
func TestDeployManifestsAndHelmCharts(t *testing.T) {
	s := newServer(t, "--manifests-resync", "3s")
	s.start()
	c := s.client()
	dyn, err := dynamic.NewForConfig(s.restConfig())
	if err != nil {
		t.Fatal(err)
	}
	dir := datadir.New(s.dataDir).ManifestsDir()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the server did not make the manifests folder: %v", err)
	}

	t.Run("folder", func(t *testing.T) {
		writeManifest(t, dir, "app.yaml", `apiVersion: v1
kind: Namespace
metadata: {name: deploy-e2e}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: app, namespace: deploy-e2e}
data: {k: v1}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: no-namespace}
data: {k: system}
`)
		// A CRD and an object of its kind in one file: the mapper must refresh.
		writeManifest(t, dir, "crd.yaml", `apiVersion: e2e.k3sm.io/v1
kind: Widget
metadata: {name: w1, namespace: default}
spec: {size: 3}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.e2e.k3sm.io}
spec:
  group: e2e.k3sm.io
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`)
		waitFor(t, time.Minute, "app.yaml applied", configMapValue(c, t, "deploy-e2e", "app", "k", "v1"))
		waitFor(t, 10*time.Second, "an object without a namespace goes to kube-system", configMapValue(c, t, "kube-system", "no-namespace", "k", "system"))
		widgets := schema.GroupVersionResource{Group: "e2e.k3sm.io", Version: "v1", Resource: "widgets"}
		waitFor(t, time.Minute, "the Widget of crd.yaml", func() error {
			_, err := dyn.Resource(widgets).Namespace("default").Get(ctx(t), "w1", metav1.GetOptions{})
			return err
		})
		cm, err := c.CoreV1().ConfigMaps("deploy-e2e").Get(ctx(t), "app", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(cm.ManagedFields) == 0 || cm.ManagedFields[0].Manager != "k3sm-deploy" || cm.ManagedFields[0].Operation != metav1.ManagedFieldsOperationApply {
			t.Errorf("managed fields %+v, want a server-side apply by k3sm-deploy", cm.ManagedFields)
		}

		// An edit is applied.
		writeManifest(t, dir, "app.yaml", strings.Replace(mustRead(t, filepath.Join(dir, "app.yaml")), "k: v1", "k: v2", 1))
		waitFor(t, 30*time.Second, "the edit of app.yaml", configMapValue(c, t, "deploy-e2e", "app", "k", "v2"))

		// A deleted object comes back on the resync (3s here).
		if err := c.CoreV1().ConfigMaps("deploy-e2e").Delete(ctx(t), "app", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the deleted ConfigMap is back", configMapValue(c, t, "deploy-e2e", "app", "k", "v2"))

		// Bad YAML is reported with its file and line; the other files still apply.
		writeManifest(t, dir, "bad.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bad\n   broken: indent\n")
		writeManifest(t, dir, "zz-after-bad.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: after-bad, namespace: default}\ndata: {k: ok}\n")
		waitFor(t, 30*time.Second, "the file after bad.yaml", configMapValue(c, t, "default", "after-bad", "k", "ok"))
		waitFor(t, 30*time.Second, "bad.yaml reported in the log", func() error {
			if !strings.Contains(s.output(), "manifest bad.yaml not applied: line 5:") {
				return fmt.Errorf("no log line naming bad.yaml line 5")
			}
			return nil
		})
		waitFor(t, 10*time.Second, "bad.yaml reported as an Event", func() error {
			evs, err := c.CoreV1().Events("kube-system").List(ctx(t), metav1.ListOptions{})
			if err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.Reason == "ManifestInvalid" && strings.Contains(e.Message, "bad.yaml") && e.Type == corev1.EventTypeWarning {
					return nil
				}
			}
			return fmt.Errorf("no ManifestInvalid event among %d", len(evs.Items))
		})
		if _, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx(t), "bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("a ConfigMap from the bad file: %v", err)
		}

		// A .skip file disables its file, even across resyncs.
		if err := os.WriteFile(filepath.Join(dir, "skipped.yaml.skip"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		writeManifest(t, dir, "skipped.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: skipped, namespace: default}\n")
		writeManifest(t, dir, "zz-marker.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: marker, namespace: default}\ndata: {k: ok}\n")
		waitFor(t, 30*time.Second, "the marker file", configMapValue(c, t, "default", "marker", "k", "ok"))
		time.Sleep(7 * time.Second) // two resyncs
		if _, err := c.CoreV1().ConfigMaps("default").Get(ctx(t), "skipped", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("skipped.yaml was applied despite skipped.yaml.skip (%v)", err)
		}
		// Without the .skip file it applies.
		if err := os.Remove(filepath.Join(dir, "skipped.yaml.skip")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "skipped.yaml once its .skip is gone", func() error {
			_, err := c.CoreV1().ConfigMaps("default").Get(ctx(t), "skipped", metav1.GetOptions{})
			return err
		})
	})

	t.Run("helmchart-inline", func(t *testing.T) {
		tgz := makeChart(t, "inline", "0.1.0")
		hc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
			"metadata": map[string]any{"name": "inline", "namespace": "kube-system"},
			"spec": map[string]any{
				"chartContent": base64.StdEncoding.EncodeToString(tgz), "targetNamespace": "helm-e2e", "createNamespace": true,
				"valuesContent": "greeting: one\n",
			},
		}}
		ri := dyn.Resource(helmChartGVR).Namespace("kube-system")
		if _, err := ri.Create(ctx(t), hc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "the inline chart's ConfigMap", configMapValue(c, t, "helm-e2e", "inline-greeting", "greeting", "one"))
		waitFor(t, 30*time.Second, "HelmChart status revision 1, Ready", chartStatus(t, dyn, "inline", 1))

		// A values change upgrades: revision 2.
		got, err := ri.Get(ctx(t), "inline", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(got.Object, map[string]any{"greeting": "two"}, "spec", "set"); err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Update(ctx(t), got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "the upgraded ConfigMap", configMapValue(c, t, "helm-e2e", "inline-greeting", "greeting", "two"))
		waitFor(t, 30*time.Second, "HelmChart status revision 2", chartStatus(t, dyn, "inline", 2))

		// Deleting the HelmChart uninstalls the release, then the finalizer goes.
		if err := ri.Delete(ctx(t), "inline", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "the release's ConfigMap gone", func() error {
			_, err := c.CoreV1().ConfigMaps("helm-e2e").Get(ctx(t), "inline-greeting", metav1.GetOptions{})
			return gone(err, "ConfigMap inline-greeting")
		})
		waitFor(t, 30*time.Second, "the HelmChart gone", func() error {
			_, err := ri.Get(ctx(t), "inline", metav1.GetOptions{})
			return gone(err, "HelmChart inline")
		})
		secrets, err := c.CoreV1().Secrets("helm-e2e").List(ctx(t), metav1.ListOptions{LabelSelector: "owner=helm,name=inline"})
		if err != nil || len(secrets.Items) != 0 {
			t.Errorf("helm release records left: %v %v", secrets, err)
		}
	})

	t.Run("helmchart-failure", func(t *testing.T) {
		hc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
			"metadata": map[string]any{"name": "broken", "namespace": "kube-system"},
			"spec":     map[string]any{"chartContent": "not base64!"},
		}}
		ri := dyn.Resource(helmChartGVR).Namespace("kube-system")
		if _, err := ri.Create(ctx(t), hc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the failure on the HelmChart's status", func() error {
			got, err := ri.Get(ctx(t), "broken", metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Failed" && m["status"] == "True" &&
					strings.Contains(fmt.Sprint(m["message"]), "spec.chartContent is not base64") {
					return nil
				}
			}
			return fmt.Errorf("status %v", got.Object["status"])
		})
		// Nothing was installed, so deletion is not held up.
		if err := ri.Delete(ctx(t), "broken", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the broken HelmChart gone", func() error {
			_, err := ri.Get(ctx(t), "broken", metav1.GetOptions{})
			return gone(err, "HelmChart broken")
		})
	})

	t.Run("helmchart-oci-from-folder", func(t *testing.T) {
		// A registry the test owns on 127.0.0.1, the chart pushed with helm's client.
		reg := httptest.NewServer(registry.New())
		t.Cleanup(reg.Close)
		host := strings.TrimPrefix(reg.URL, "http://")
		rc, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rc.Push(makeChart(t, "ocichart", "0.2.0"), host+"/charts/ocichart:0.2.0"); err != nil {
			t.Fatalf("push the chart: %v", err)
		}
		writeManifest(t, dir, "ocichart.yaml", fmt.Sprintf(`apiVersion: helm.cattle.io/v1
kind: HelmChart
metadata: {name: ocichart, namespace: kube-system}
spec:
  chart: oci://%s/charts/ocichart
  plainHTTP: true
  targetNamespace: default
  valuesContent: |
    greeting: from-oci
`, host))
		waitFor(t, 2*time.Minute, "the OCI chart's ConfigMap", configMapValue(c, t, "default", "ocichart-greeting", "greeting", "from-oci"))
		waitFor(t, 30*time.Second, "HelmChart ocichart status", chartStatus(t, dyn, "ocichart", 1))
		out, err := s.kubectl("get", "helmcharts", "-n", "kube-system", "ocichart")
		if err != nil || !strings.Contains(out, "True") {
			t.Errorf("kubectl get helmcharts: %v\n%s", err, out)
		}
	})

	t.Run("helmchart-repo", func(t *testing.T) {
		// A chart repository the test serves on 127.0.0.1: index.yaml and the .tgz.
		tgz := makeChart(t, "repochart", "1.0.0")
		sum := sha256.Sum256(tgz)
		index := fmt.Sprintf(`apiVersion: v1
entries:
  repochart:
  - apiVersion: v2
    name: repochart
    version: 1.0.0
    digest: %x
    urls: [charts/repochart-1.0.0.tgz]
generated: "2026-01-01T00:00:00Z"
`, sum)
		repoSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/index.yaml":
				_, _ = w.Write([]byte(index))
			case "/charts/repochart-1.0.0.tgz":
				_, _ = w.Write(tgz)
			default:
				http.NotFound(w, r)
			}
		}))
		t.Cleanup(repoSrv.Close)
		hc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
			"metadata": map[string]any{"name": "repochart", "namespace": "kube-system"},
			"spec":     map[string]any{"repo": repoSrv.URL, "chart": "repochart", "targetNamespace": "default", "set": map[string]any{"greeting": "from-repo"}},
		}}
		if _, err := dyn.Resource(helmChartGVR).Namespace("kube-system").Create(ctx(t), hc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "the repo chart's ConfigMap", configMapValue(c, t, "default", "repochart-greeting", "greeting", "from-repo"))
		waitFor(t, 30*time.Second, "HelmChart repochart status", chartStatus(t, dyn, "repochart", 1))
	})

	// Values from Secrets and a HelmChartConfig, layered as helm's repeated
	// -f; each change upgrades the release once, by the Secret watch alone
	// (no change of the HelmChart, no failure to retry).
	t.Run("helmchart-values-secrets-and-config", func(t *testing.T) {
		ri := dyn.Resource(helmChartGVR).Namespace("kube-system")
		secrets := c.CoreV1().Secrets("kube-system")
		hc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
			"metadata": map[string]any{"name": "valsec", "namespace": "kube-system"},
			"spec": map[string]any{
				"chartContent": base64.StdEncoding.EncodeToString(makeChart(t, "valsec", "0.1.0")), "targetNamespace": "default",
				"valuesContent": "greeting: from-content\n",
				"values":        map[string]any{"greeting": "from-values"},
				"valuesSecrets": []any{
					map[string]any{"name": "valsec-values", "keys": []any{"values.yaml"}},
					// Optional: missing is fine, and its changes do not upgrade.
					map[string]any{"name": "valsec-optional", "keys": []any{"values.yaml"}, "ignoreUpdates": true},
				},
			},
		}}
		if _, err := ri.Create(ctx(t), hc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the missing values Secret on the status", chartFailed(t, dyn, "valsec",
			"spec.valuesSecrets[0]: Secret kube-system/valsec-values not found", "kubectl create secret generic valsec-values -n kube-system --from-file=values.yaml="))
		waitFor(t, 10*time.Second, "the missing values Secret as an Event", chartEvent(t, c, "valsec", "Secret kube-system/valsec-values not found"))
		if _, err := c.CoreV1().ConfigMaps("default").Get(ctx(t), "valsec-greeting", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("deployed without its values Secret: %v", err)
		}

		// (1) The Secret is created: the chart deploys with its value.
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "valsec-values"}, Data: map[string][]byte{"values.yaml": []byte("greeting: from-secret-1\n")}}
		if _, err := secrets.Create(ctx(t), sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "the chart deployed with the Secret's value", configMapValue(c, t, "default", "valsec-greeting", "greeting", "from-secret-1"))
		waitFor(t, 30*time.Second, "revision 1", chartStatus(t, dyn, "valsec", 1))
		digest1 := valuesDigestOf(t, dyn, "valsec")

		// (2) The Secret is edited: upgraded with the new value.
		got, err := secrets.Get(ctx(t), "valsec-values", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Data["values.yaml"] = []byte("greeting: from-secret-2\n")
		if _, err := secrets.Update(ctx(t), got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the upgrade with the edited Secret", configMapValue(c, t, "default", "valsec-greeting", "greeting", "from-secret-2"))
		waitFor(t, 30*time.Second, "revision 2", chartStatus(t, dyn, "valsec", 2))
		digest2 := valuesDigestOf(t, dyn, "valsec")
		if digest2 == digest1 {
			t.Errorf("status.valuesDigest %s unchanged by a new value", digest2)
		}

		// (3) A HelmChartConfig of the same name: its value wins.
		cfgs := dyn.Resource(helmChartConfigGVR).Namespace("kube-system")
		cfg := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChartConfig",
			"metadata": map[string]any{"name": "valsec", "namespace": "kube-system"},
			"spec":     map[string]any{"valuesContent": "greeting: from-config\n"},
		}}
		if _, err := cfgs.Create(ctx(t), cfg, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the HelmChartConfig's value", configMapValue(c, t, "default", "valsec-greeting", "greeting", "from-config"))
		waitFor(t, 30*time.Second, "revision 3", chartStatus(t, dyn, "valsec", 3))

		// (4) The HelmChartConfig is deleted: back to the Secret's value.
		if err := cfgs.Delete(ctx(t), "valsec", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the Secret's value again", configMapValue(c, t, "default", "valsec-greeting", "greeting", "from-secret-2"))
		waitFor(t, 30*time.Second, "revision 4", chartStatus(t, dyn, "valsec", 4))
		if d := valuesDigestOf(t, dyn, "valsec"); d != digest2 {
			t.Errorf("status.valuesDigest %s, want %s as at revision 2 (the same values)", d, digest2)
		}

		// No upgrade for: the optional Secret appearing (ignoreUpdates), nor
		// a watched Secret whose change leaves its values as they are.
		if _, err := secrets.Create(ctx(t), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "valsec-optional"},
			Data: map[string][]byte{"values.yaml": []byte("greeting: from-optional\n")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err = secrets.Get(ctx(t), "valsec-values", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Labels = map[string]string{"touched": "yes"}
		if _, err := secrets.Update(ctx(t), got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		if err := chartStatus(t, dyn, "valsec", 4)(); err != nil {
			t.Errorf("after the optional Secret and a label on the watched one: %v", err)
		}
		if err := configMapValue(c, t, "default", "valsec-greeting", "greeting", "from-secret-2")(); err != nil {
			t.Error(err)
		}
		recs, err := c.CoreV1().Secrets("default").List(ctx(t), metav1.ListOptions{LabelSelector: "owner=helm,name=valsec"})
		if err != nil || len(recs.Items) != 4 {
			t.Errorf("helm release records: %d (err %v), want revisions 1..4", len(recs.Items), err)
		}
	})

	// A restart applies what changed while the server was down, and leaves
	// an up-to-date release alone (its registry is gone by now).
	t.Run("restart", func(t *testing.T) {
		s.stop()
		writeManifest(t, dir, "app.yaml", strings.Replace(mustRead(t, filepath.Join(dir, "app.yaml")), "k: v2", "k: v3", 1))
		s.start()
		c := s.client()
		waitFor(t, 30*time.Second, "the edit made while stopped", configMapValue(c, t, "deploy-e2e", "app", "k", "v3"))
		time.Sleep(3 * time.Second)
		if err := chartStatus(t, dyn, "ocichart", 1)(); err != nil {
			t.Errorf("after a restart: %v", err)
		}
		if strings.Contains(s.output(), "helm release deployed") {
			t.Errorf("a restart redeployed an up-to-date release:\n%s", s.output())
		}
	})
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func chartStatus(t *testing.T, dyn dynamic.Interface, name string, revision int64) func() error {
	return func() error {
		hc, err := dyn.Resource(helmChartGVR).Namespace("kube-system").Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		rev, _, _ := unstructured.NestedInt64(hc.Object, "status", "revision")
		conds, _, _ := unstructured.NestedSlice(hc.Object, "status", "conditions")
		ready := false
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Ready" && m["status"] == "True" {
				ready = true
			}
		}
		if rev != revision || !ready {
			return fmt.Errorf("status %v, want revision %d and Ready", hc.Object["status"], revision)
		}
		return nil
	}
}

// chartStatusLatest wants the chart Ready at its current generation, at
// one of the revisions.
func chartStatusLatest(t *testing.T, dyn dynamic.Interface, name string, revisions ...int64) func() error {
	return func() error {
		hc, err := dyn.Resource(helmChartGVR).Namespace("kube-system").Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		observed, _, _ := unstructured.NestedInt64(hc.Object, "status", "observedGeneration")
		rev, _, _ := unstructured.NestedInt64(hc.Object, "status", "revision")
		if observed != hc.GetGeneration() || !slices.Contains(revisions, rev) {
			return fmt.Errorf("generation %d, status %v: want it observed at a revision of %v", hc.GetGeneration(), hc.Object["status"], revisions)
		}
		return chartStatus(t, dyn, name, rev)()
	}
}

func valuesDigestOf(t *testing.T, dyn dynamic.Interface, name string) string {
	t.Helper()
	hc, err := dyn.Resource(helmChartGVR).Namespace("kube-system").Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d, _, _ := unstructured.NestedString(hc.Object, "status", "valuesDigest")
	if !strings.HasPrefix(d, "sha256:") {
		t.Fatalf("status.valuesDigest %q, want sha256:...", d)
	}
	return d
}

// makeChart builds a chart .tgz whose one template is a ConfigMap
// <release>-greeting carrying .Values.greeting.
func makeChart(t *testing.T, name, version string) []byte {
	return charttest.Chart(t, name, version)
}
