package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
	"k8s.io/kubernetes/pkg/controller/serviceaccount"

	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

func activeNamespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}
}

// writes lists the create and update actions on ServiceAccounts and
// ConfigMaps in namespace ns.
func writes(c *fake.Clientset, ns string) []string {
	var out []string
	for _, a := range c.Actions() {
		r := a.GetResource().Resource
		if a.GetNamespace() == ns && (r == "serviceaccounts" || r == "configmaps") && (a.GetVerb() == "create" || a.GetVerb() == "update") {
			out = append(out, a.GetVerb()+" "+r)
		}
	}
	return out
}

// The objects the server makes are what the upstream controllers make: run
// the controller-manager's own ServiceAccount and root-CA publisher
// controllers afterwards, and they write nothing in default, while in a
// witness namespace they create objects equal to the server's.
func TestNamespaceDefaultsAsUpstreamControllersMakeThem(t *testing.T) {
	ca := []byte("-----BEGIN CERTIFICATE-----\nnot parsed here\n-----END CERTIFICATE-----\n")
	c := fake.NewClientset(activeNamespace("default"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureNamespaceDefaults(ctx, c, "default", ca); err != nil {
		t.Fatal(err)
	}
	// Again, as on a warm start: the objects exist and are left alone.
	if err := EnsureNamespaceDefaults(ctx, c, "default", ca); err != nil {
		t.Fatal(err)
	}
	if got := writes(c, "default"); !reflect.DeepEqual(got, []string{"create serviceaccounts", "create configmaps", "create serviceaccounts", "create configmaps"}) {
		t.Fatalf("writes in default = %q", got)
	}
	c.ClearActions()

	factory := informers.NewSharedInformerFactory(c, 0)
	pub, err := rootcacertpublisher.NewPublisher(factory.Core().V1().ConfigMaps(), factory.Core().V1().Namespaces(), c, ca)
	if err != nil {
		t.Fatal(err)
	}
	sac, err := serviceaccount.NewServiceAccountsController(klog.Background(), factory.Core().V1().ServiceAccounts(), factory.Core().V1().Namespaces(), c, serviceaccount.DefaultServiceAccountsControllerOptions())
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	// One worker each and a FIFO queue: the witness, added after the
	// informers listed default, is synced after default.
	go pub.Run(ctx, 1)
	go sac.Run(ctx, 1)
	if _, err := c.CoreV1().Namespaces().Create(ctx, activeNamespace("witness"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var upstreamCM *corev1.ConfigMap
	var upstreamSA *corev1.ServiceAccount
	// Until the test's context ends, as long as it has.
	// The fake clientset answers a Get of a missing object with an empty
	// one and NotFound: the error says whether it is there.
	poll.Every(t, ctx, 30*time.Second, poll.Interval, "the upstream controllers to sync the witness namespace", func() (err error) {
		if upstreamCM, err = c.CoreV1().ConfigMaps("witness").Get(ctx, rootcacertpublisher.RootCACertConfigMapName, metav1.GetOptions{}); err != nil {
			return err
		}
		upstreamSA, err = c.CoreV1().ServiceAccounts("witness").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	if got := writes(c, "default"); len(got) != 0 {
		t.Errorf("the upstream controllers rewrote default's objects: %q", got)
	}
	ours, err := c.CoreV1().ConfigMaps("default").Get(ctx, rootcacertpublisher.RootCACertConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ours.Data, upstreamCM.Data) || !reflect.DeepEqual(ours.Annotations, upstreamCM.Annotations) || !reflect.DeepEqual(ours.Labels, upstreamCM.Labels) {
		t.Errorf("ConfigMap differs from upstream's:\nours     %+v\nupstream %+v", ours, upstreamCM)
	}
	oursSA, err := c.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oursSA.Namespace, upstreamSA.Namespace = "", ""
	if !reflect.DeepEqual(oursSA, upstreamSA) {
		t.Errorf("ServiceAccount differs from upstream's:\nours     %+v\nupstream %+v", oursSA, upstreamSA)
	}
}

// Before the apiserver has made the namespace, creates fail with NotFound:
// the server retries until the namespace is there.
func TestNamespaceDefaultsWaitForTheNamespace(t *testing.T) {
	c := fake.NewClientset()
	created := false
	c.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetResource().Resource == "namespaces" {
			return false, nil, nil
		}
		if _, err := c.Tracker().Get(corev1.SchemeGroupVersion.WithResource("namespaces"), "", a.GetNamespace()); err != nil {
			return true, nil, err
		}
		created = true
		return false, nil, nil
	})
	go func() {
		time.Sleep(200 * time.Millisecond)
		c.CoreV1().Namespaces().Create(context.Background(), activeNamespace("default"), metav1.CreateOptions{})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureNamespaceDefaults(ctx, c, "default", []byte("ca")); err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Fatal("nothing was created")
	}
	if _, err := c.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}

	// A namespace that never comes: the error says which, once ctx ends.
	sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer scancel()
	err := EnsureNamespaceDefaults(sctx, c, "absent", nil)
	if err == nil || !strings.Contains(err.Error(), "absent") {
		t.Fatalf("err = %v, want one naming the namespace", err)
	}
}

// The CA published is the controller-manager's last --root-ca-file, as
// upstream reads it, and a file that upstream would refuse is not published.
func TestPublishedRootCA(t *testing.T) {
	dir := t.TempDir()
	caObj, err := pki.LoadOrCreateCA(dir, "ca", "test-ca")
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.crt")
	if err := os.WriteFile(bad, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, ok, err := PublishedRootCA([]string{"--root-ca-file=" + bad, "--kubeconfig=x", "--root_ca_file=" + caObj.CertPath})
	want, _ := os.ReadFile(caObj.CertPath)
	if err != nil || !ok || string(got) != string(want) {
		t.Fatalf("PublishedRootCA = %q, %v, %v; want the CA file's content", got, ok, err)
	}
	if _, ok, err := PublishedRootCA([]string{"--kubeconfig=x"}); ok || err != nil {
		t.Fatalf("without --root-ca-file: ok=%v err=%v, want false, nil", ok, err)
	}
	if _, ok, err := PublishedRootCA([]string{"--root-ca-file=" + bad}); ok || err == nil || !strings.Contains(err.Error(), "--root-ca-file") {
		t.Fatalf("unparsable file: ok=%v err=%v, want false and an error naming the flag", ok, err)
	}
	if _, ok, err := PublishedRootCA([]string{"--root-ca-file=" + filepath.Join(dir, "missing")}); ok || err == nil {
		t.Fatalf("missing file: ok=%v err=%v, want false and an error", ok, err)
	}
}
