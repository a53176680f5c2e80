package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// TestServerAPI runs one server and checks the API surface an upstream
// control plane must have.
func TestServerAPI(t *testing.T) {
	s := newServer(t, "--kube-apiserver-arg=service-node-port-range=20000-32767",
		"--kube-controller-manager-arg=kube-api-qps=150", "--kube-scheduler-arg=v=1")
	s.start()
	c := s.client()

	// --kube-*-arg reaches the component: the apiserver takes a NodePort
	// below the default range, and the controller-manager runs with the
	// user's rate instead of k3sm's.
	t.Run("component args", func(t *testing.T) {
		cx := ctx(t)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "low-nodeport"}, Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{{Port: 80, NodePort: 20080}}}}
		if _, err := c.CoreV1().Services("default").Create(cx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("nodePort 20080 with --kube-apiserver-arg=service-node-port-range=20000-32767: %v", err)
		}
		c.CoreV1().Services("default").Delete(cx, "low-nodeport", metav1.DeleteOptions{})
		// The scheduler and controller-manager share a process, so the
		// scheduler's --v is the controller-manager's too.
		rc := controllersConfig(t, s)
		for _, tc := range []struct {
			role string
			args []string
			want []string
		}{
			{"kube-controller-manager", rc.ControllerManager, []string{"--kube-api-qps=150", "--v=1"}},
			{"kube-scheduler", rc.Scheduler, []string{"--v=1"}},
		} {
			for _, want := range tc.want {
				n := 0
				for _, a := range tc.args {
					if strings.HasPrefix(a, strings.SplitN(want, "=", 2)[0]+"=") {
						n++
						if a != want {
							t.Errorf("%s runs with %s, want %s", tc.role, a, want)
						}
					}
				}
				if n != 1 {
					t.Errorf("%s: %d of %s in %q", tc.role, n, want, tc.args)
				}
			}
		}
		// What the running process parsed: at --v=1 each component logs its flags.
		log := readFile(t, filepath.Join(s.dataDir, "logs", "kube-controllers.log"))
		for _, want := range []string{`FLAG: --kube-api-qps="150"`, `FLAG: --config="` + filepath.Join(s.dataDir, "run", "kube-scheduler.json") + `"`} {
			if !strings.Contains(log, want) {
				t.Errorf("kube-controllers.log lacks %s", want)
			}
		}
	})

	// One process runs the scheduler and the controller-manager, and serves
	// both their health endpoints (issue 17: a process of the big binary
	// costs ~17 MiB).
	t.Run("scheduler and controller-manager in one process", func(t *testing.T) {
		pid := oneControllersProcess(t, s)
		for _, port := range []int{s.ports[1], s.ports[2]} {
			if err := healthz(s, port); err != nil {
				t.Error(err)
			}
			if !listensOn(t, pid, port) {
				t.Errorf("port %d is not served by the kube-controllers process %d", port, pid)
			}
		}
	})

	t.Run("readyz", func(t *testing.T) {
		rc := s.restConfig()
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(rc.CAData)
		pair, err := tls.X509KeyPair(rc.CertData, rc.KeyData)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}}
		resp, err := hc.Get(rc.Host + "/readyz?verbose")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("/readyz: %s", resp.Status)
		}
	})

	t.Run("core objects CRUD and watch", func(t *testing.T) { coreCRUDAndWatch(t, s) })

	// The server makes what a first pod in default needs itself, as the
	// controller-manager would (it does not rewrite it), and starts the
	// node with the apiserver, before the scheduler (spawned at /readyz).
	t.Run("start-up shortcuts", func(t *testing.T) {
		cx := ctx(t)
		// The root-CA publisher has synced default once it publishes into
		// crud, made after default (one FIFO queue).
		waitFor(t, time.Minute, "kube-root-ca.crt in crud", func() error {
			_, err := c.CoreV1().ConfigMaps("crud").Get(cx, "kube-root-ca.crt", metav1.GetOptions{})
			return err
		})
		cm, err := c.CoreV1().ConfigMaps("default").Get(cx, "kube-root-ca.crt", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ca, err := os.ReadFile(filepath.Join(s.dataDir, "server", "tls", "server-ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		if cm.Data["ca.crt"] != string(ca) || cm.Annotations["kubernetes.io/description"] == "" {
			t.Errorf("default/kube-root-ca.crt: data %q annotations %v, want the server CA and a description", cm.Data, cm.Annotations)
		}
		var managers []string
		for _, m := range cm.ManagedFields {
			managers = append(managers, m.Manager+" "+string(m.Operation))
		}
		t.Logf("default/kube-root-ca.crt written by %v", managers)
		if len(managers) != 1 {
			t.Errorf("default/kube-root-ca.crt was rewritten: managed fields %v", managers)
		}
		if _, err := c.CoreV1().ServiceAccounts("default").Get(cx, "default", metav1.GetOptions{}); err != nil {
			t.Error(err)
		}
		node, sched := s.childPids("node"), s.childPids("kube-controllers")
		if len(node) != 1 || len(sched) != 1 {
			t.Fatalf("node pids %v, scheduler pids %v", node, sched)
		}
		if n, sc := procStartTicks(t, node[0]), procStartTicks(t, sched[0]); n >= sc {
			t.Errorf("the node started at tick %d, not before the scheduler (%d)", n, sc)
		}
	})

	t.Run("CRD and custom object", func(t *testing.T) { crdAndCustomObject(t, s) })

	t.Run("server-side apply conflict", func(t *testing.T) { serverSideApplyConflict(t, s) })

	t.Run("RBAC", func(t *testing.T) {
		cx := ctx(t)
		as := func(user string) kubernetes.Interface {
			rc := s.restConfig()
			rc.Impersonate.UserName = user
			return kubernetes.NewForConfigOrDie(rc)
		}
		if _, err := as("carol").CoreV1().Pods("default").List(cx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("user without bindings: want Forbidden, got %v", err)
		}
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-reader", Namespace: "default"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}}}
		if _, err := c.RbacV1().Roles("default").Create(cx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "dave-reads-pods", Namespace: "default"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-reader"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "dave"}}}
		if _, err := c.RbacV1().RoleBindings("default").Create(cx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "dave may list pods", func() error {
			_, err := as("dave").CoreV1().Pods("default").List(cx, metav1.ListOptions{})
			return err
		})
		if _, err := as("dave").CoreV1().Pods("kube-system").List(cx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("dave in another namespace: want Forbidden, got %v", err)
		}
		if _, err := as("dave").CoreV1().Secrets("default").List(cx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("dave listing secrets: want Forbidden, got %v", err)
		}
	})

	t.Run("Deployment makes ReplicaSet and Pods", func(t *testing.T) {
		cx := ctx(t)
		labels := map[string]string{"app": "web"}
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](3),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				// The image does not exist: the pods are made but never run.
				Spec: corev1.PodSpec{NodeSelector: map[string]string{"kubernetes.io/os": "linux"},
					Containers: []corev1.Container{{Name: "web", Image: "example.invalid/web:1"}}}},
		}}
		if _, err := c.AppsV1().Deployments("default").Create(cx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "ReplicaSet and 3 Pods", func() error {
			rs, err := c.AppsV1().ReplicaSets("default").List(cx, metav1.ListOptions{LabelSelector: "app=web"})
			if err != nil || len(rs.Items) != 1 {
				return fmt.Errorf("replicasets: %v %v", len(rs.Items), err)
			}
			pods, err := c.CoreV1().Pods("default").List(cx, metav1.ListOptions{LabelSelector: "app=web"})
			if err != nil || len(pods.Items) != 3 {
				return fmt.Errorf("pods: %d %v", len(pods.Items), err)
			}
			for _, p := range pods.Items {
				if len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Name != rs.Items[0].Name {
					return fmt.Errorf("pod %s not owned by the ReplicaSet", p.Name)
				}
			}
			return nil
		})
	})

	t.Run("embedded kubectl and kubeconfig", func(t *testing.T) {
		out, err := s.kubectl("get", "namespaces", "-o", "name")
		if err != nil || !strings.Contains(out, "namespace/kube-system") {
			t.Fatalf("kubectl get ns: %v\n%s", err, out)
		}
		out, err = s.kubectl("version")
		if err != nil || !strings.Contains(out, "Server Version: v1.37.2") {
			t.Fatalf("kubectl version: %v\n%s", err, out)
		}
		// kubectl with no --kubeconfig defaults to the admin kubeconfig of $K3SM_DATA_DIR.
		cmd := exec.Command(k3smBin, "kubectl", "get", "ns", "default", "-o", "name")
		cmd.Env = append(os.Environ(), "K3SM_DATA_DIR="+s.dataDir, "KUBECONFIG=")
		if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "namespace/default" {
			t.Fatalf("default kubeconfig: %v\n%s", err, out)
		}
		cmd = exec.Command(k3smBin, "kubectl", "--data-dir", s.dataDir, "get", "ns", "default", "-o", "name")
		cmd.Env = append(os.Environ(), "KUBECONFIG=")
		if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "namespace/default" {
			t.Fatalf("k3sm kubectl --data-dir: %v\n%s", err, out)
		}
		// A data dir with no server says where it looked and how to point
		// elsewhere, instead of kubectl's localhost:8080.
		nowhere := t.TempDir()
		cmd = exec.Command(k3smBin, "kubectl", "get", "pods")
		cmd.Env = append(os.Environ(), "K3SM_DATA_DIR="+nowhere, "KUBECONFIG=", "HOME="+t.TempDir())
		out, err = func() (string, error) { b, err := cmd.CombinedOutput(); return string(b), err }()
		if err == nil || strings.Contains(out, "8080") || !strings.Contains(out, filepath.Join(nowhere, "admin.kubeconfig")) || !strings.Contains(out, "--data-dir DIR") {
			t.Fatalf("kubectl with no cluster in K3SM_DATA_DIR: %v\n%s", err, out)
		}
		printed, err := exec.Command(k3smBin, "kubeconfig", "--data-dir", s.dataDir).Output()
		if err != nil || !strings.Contains(string(printed), fmt.Sprintf("https://127.0.0.1:%d", s.port)) {
			t.Fatalf("k3sm kubeconfig: %v\n%s", err, printed)
		}
		target := filepath.Join(t.TempDir(), "config")
		existing := "apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster:\n    server: https://127.0.0.2:1\ncontexts:\n- name: other\n  context:\n    cluster: other\n    user: other\nusers:\n- name: other\n  user:\n    token: x\ncurrent-context: other\npreferences: {}\nx-unknown-key: keep-me\n"
		os.WriteFile(target, []byte(existing), 0o600)
		if out, err := exec.Command(k3smBin, "kubeconfig", "--data-dir", s.dataDir, "--merge", "--kubeconfig", target).CombinedOutput(); err != nil {
			t.Fatalf("merge: %v\n%s", err, out)
		}
		merged, _ := os.ReadFile(target)
		for _, want := range []string{"x-unknown-key: keep-me", "name: other", "current-context: k3sm"} {
			if !strings.Contains(string(merged), want) {
				t.Fatalf("merged kubeconfig lacks %q:\n%s", want, merged)
			}
		}
		out, err = s.kubectl("--kubeconfig", target, "--context", "k3sm", "get", "ns", "default", "-o", "name")
		if err != nil {
			t.Fatalf("merged kubeconfig does not work: %v\n%s", err, out)
		}
	})

	t.Run("narrowed controllers", func(t *testing.T) {
		out := readFile(t, filepath.Join(s.dataDir, "logs", "kube-controllers.log"))
		if !strings.Contains(out, "persistentvolume-attach-detach-controller") {
			t.Fatalf("controller-manager log does not mention the disabled attach/detach controller")
		}
	})

	t.Run("file modes", func(t *testing.T) {
		for _, p := range []string{"server/tls/server-ca.key", "server/tls/service-account.key", "admin.kubeconfig"} {
			st, err := os.Stat(filepath.Join(s.dataDir, p))
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("%s: mode %v, %v; want 0600", p, st.Mode(), err)
			}
		}
		for _, p := range []string{"server", "server/tls", "server/db", "logs"} {
			st, err := os.Stat(filepath.Join(s.dataDir, p))
			if err != nil || st.Mode().Perm() != 0o700 {
				t.Fatalf("%s: mode %v, %v; want 0700", p, st.Mode(), err)
			}
		}
	})
}

// coreCRUDAndWatch: ConfigMaps in a new namespace crud are created, read,
// listed and deleted, and a watch sees it all.
func coreCRUDAndWatch(t *testing.T, s *server) {
	c := s.client()
	cx := ctx(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "crud"}}
	if _, err := c.CoreV1().Namespaces().Create(cx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := c.CoreV1().ConfigMaps("crud").Watch(cx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := range 3 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}, Data: map[string]string{"i": fmt.Sprint(i)}}
		if _, err := c.CoreV1().ConfigMaps("crud").Create(cx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.CoreV1().ConfigMaps("crud").Get(cx, "cm-1", metav1.GetOptions{})
	if err != nil || got.Data["i"] != "1" {
		t.Fatalf("get: %v %v", got, err)
	}
	list, err := c.CoreV1().ConfigMaps("crud").List(cx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// kube-root-ca.crt is published into every namespace by the controller-manager.
	names := map[string]bool{}
	for _, cm := range list.Items {
		names[cm.Name] = true
	}
	for i := range 3 {
		if !names[fmt.Sprintf("cm-%d", i)] {
			t.Fatalf("list misses cm-%d: %v", i, names)
		}
	}
	if err := c.CoreV1().ConfigMaps("crud").Delete(cx, "cm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	seen := map[watch.EventType]int{}
	timeout := time.After(30 * time.Second)
	for seen[watch.Added] < 3 || seen[watch.Deleted] < 1 {
		select {
		case ev := <-w.ResultChan():
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && strings.HasPrefix(cm.Name, "cm-") {
				seen[ev.Type]++
			}
		case <-timeout:
			t.Fatalf("watch saw %v, want 3 ADDED and 1 DELETED", seen)
		}
	}
}

// crdAndCustomObject: a CRD is established, serves its objects and
// validates them against its schema.
func crdAndCustomObject(t *testing.T, s *server) {
	cx := ctx(t)
	ext := apiextclient.NewForConfigOrDie(s.restConfig())
	crd := &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.k3sm.dev"},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: "example.k3sm.dev",
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextv1.JSONSchemaProps{"size": {Type: "integer"}}},
					},
				}},
			}},
		},
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(cx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "CRD established", func() error {
		got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(cx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", got.Status.Conditions)
	})
	dyn := dynamic.NewForConfigOrDie(s.restConfig())
	gvr := schema.GroupVersionResource{Group: "example.k3sm.dev", Version: "v1", Resource: "widgets"}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.k3sm.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w1"}, "spec": map[string]any{"size": int64(3)},
	}}
	waitFor(t, time.Minute, "create Widget", func() error {
		_, err := dyn.Resource(gvr).Namespace("default").Create(cx, obj, metav1.CreateOptions{})
		return err
	})
	got, err := dyn.Resource(gvr).Namespace("default").Get(cx, "w1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size"); size != 3 {
		t.Fatalf("spec.size = %d", size)
	}
	// A schema violation is rejected by the apiserver.
	bad := obj.DeepCopy()
	bad.SetName("w2")
	_ = unstructured.SetNestedField(bad.Object, "big", "spec", "size")
	if _, err := dyn.Resource(gvr).Namespace("default").Create(cx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("want Invalid for a string size, got %v", err)
	}
}

// serverSideApplyConflict: a second field manager conflicts, names the
// first, and wins when forced.
func serverSideApplyConflict(t *testing.T, s *server) {
	c := s.client()
	cx := ctx(t)
	apply := func(manager, value string, force bool) error {
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ssa","namespace":"default"},"data":{"owner":%q}}`, value)
		_, err := c.CoreV1().ConfigMaps("default").Patch(cx, "ssa", types.ApplyPatchType, []byte(body),
			metav1.PatchOptions{FieldManager: manager, Force: ptr.To(force)})
		return err
	}
	if err := apply("alice", "a", false); err != nil {
		t.Fatal(err)
	}
	err := apply("bob", "b", false)
	if !apierrors.IsConflict(err) {
		t.Fatalf("bob's apply: want a field-manager conflict, got %v", err)
	}
	if !strings.Contains(err.Error(), "alice") {
		t.Fatalf("conflict should name the other manager: %v", err)
	}
	if err := apply("bob", "b", true); err != nil {
		t.Fatalf("forced apply: %v", err)
	}
	got, _ := c.CoreV1().ConfigMaps("default").Get(cx, "ssa", metav1.GetOptions{})
	if got.Data["owner"] != "b" {
		t.Fatalf("owner = %q after forced apply", got.Data["owner"])
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRestartAndCrashRecovery: objects survive a stop/start, children are not
// orphaned, and a kill -9 of the apiserver or kine is recovered without losing
// an acknowledged write.
func TestRestartAndCrashRecovery(t *testing.T) {
	s := newServer(t)
	s.start()
	cx := ctx(t)
	mk := func(name string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": name}}
		if _, err := s.client().CoreV1().ConfigMaps("default").Create(cx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	has := func(name string) error {
		_, err := s.client().CoreV1().ConfigMaps("default").Get(cx, name, metav1.GetOptions{})
		return err
	}
	mk("before-restart")
	children := map[string][]int{}
	oneAPIServerProcess(t, s)
	for _, role := range []string{"kube-apiserver", "kube-controllers"} {
		children[role] = s.childPids(role)
		if len(children[role]) != 1 {
			t.Fatalf("want one %s child, found %v", role, children[role])
		}
	}
	s.stop()
	for role, pids := range children {
		for _, pid := range pids {
			if syscall.Kill(pid, 0) == nil {
				t.Fatalf("%s (pid %d) still running after the server stopped", role, pid)
			}
		}
	}

	s.start()
	waitFor(t, 30*time.Second, "object kept across restart", func() error { return has("before-restart") })

	// kine runs in the apiserver's process (oneAPIServerProcess): a kill
	// -9 of it ends the datastore's server mid-write too.
	{
		const name = "acked-before-kill"
		mk(name) // acknowledged by the apiserver, so it must survive
		pids := s.childPids("kube-apiserver")
		if len(pids) != 1 {
			t.Fatalf("want one kube-apiserver child, found %v", pids)
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitFor(t, 2*time.Minute, "API back after kill -9 of kube-apiserver", func() error { return has(name) })
		t.Logf("API answered %s after kill -9 of kube-apiserver", time.Since(start).Round(time.Millisecond))
		if now := s.childPids("kube-apiserver"); len(now) != 1 || now[0] == pids[0] {
			t.Fatalf("kube-apiserver was not restarted: %v", now)
		}
		mk("after-kill")
	}
	// The controller-manager may have ended once meanwhile: it was still
	// building its controllers when the apiserver went away, and a
	// restarted apiserver refuses requests until its RBAC caches sync; the
	// supervisor restarts it. Wait until it is back and healthy.
	waitFor(t, time.Minute, "kube-controllers running and healthy", func() error {
		if pids := s.childPids("kube-controllers"); len(pids) != 1 {
			return fmt.Errorf("kube-controllers processes %v", pids)
		}
		for _, port := range []int{s.ports[1], s.ports[2]} {
			if err := healthz(s, port); err != nil {
				return err
			}
		}
		return nil
	})
	// A kill -9 of the process running the scheduler and controller-manager
	// brings both back, in one new process, and both work: a new pod is
	// scheduled, a new namespace gets its kube-root-ca.crt.
	pid := oneControllersProcess(t, s)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "scheduler and controller-manager back after kill -9", func() error {
		if now := s.childPids("kube-controllers"); len(now) != 1 || now[0] == pid {
			return fmt.Errorf("kube-controllers processes %v (killed %d)", now, pid)
		}
		for _, port := range []int{s.ports[1], s.ports[2]} {
			if err := healthz(s, port); err != nil {
				return err
			}
		}
		return nil
	})
	pid = oneControllersProcess(t, s)
	for _, port := range []int{s.ports[1], s.ports[2]} {
		if !listensOn(t, pid, port) {
			t.Errorf("port %d is not served by the new kube-controllers process %d", port, pid)
		}
	}
	c := s.client()
	if _, err := c.CoreV1().Namespaces().Create(cx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "after-kill"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The new controller-manager makes the namespace's default
	// ServiceAccount; until then admission refuses a pod there.
	waitFor(t, time.Minute, "the ServiceAccount default in a namespace made after the kill", func() error {
		_, err := c.CoreV1().ServiceAccounts("after-kill").Get(cx, "default", metav1.GetOptions{})
		return err
	})
	// Scheduled, never run: its registry is a closed loopback port.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "after-kill"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "c", Image: "127.0.0.1:1/none:1"}}}}
	if _, err := c.CoreV1().Pods("after-kill").Create(cx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "pod scheduled and kube-root-ca.crt published after the restart", func() error {
		p, err := c.CoreV1().Pods("after-kill").Get(cx, "after-kill", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName == "" {
			return fmt.Errorf("pod not scheduled")
		}
		_, err = c.CoreV1().ConfigMaps("after-kill").Get(cx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})
	if !strings.Contains(s.output(), "component exited; restarting") {
		t.Fatalf("supervisor log does not say why it restarted:\n%s", s.output())
	}
}

// controllersConfig reads the role config of the process that runs the
// scheduler and controller-manager.
func controllersConfig(t *testing.T, s *server) roleconfig.ControllersConfig {
	t.Helper()
	var rc roleconfig.ControllersConfig
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(s.dataDir, "run", "kube-controllers.json"))), &rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

// oneControllersProcess returns the pid of the one process running the
// scheduler and controller-manager, and fails if either runs apart.
// oneAPIServerProcess returns the pid of the one kube-apiserver process,
// failing unless it serves kine and no kine process of its own runs.
func oneAPIServerProcess(t *testing.T, s *server) int {
	t.Helper()
	pids := s.childPids("kube-apiserver")
	if len(pids) != 1 {
		t.Fatalf("kube-apiserver processes: %v, want one", pids)
	}
	if apart := s.childPids("kine"); len(apart) != 0 {
		t.Fatalf("kine runs in a process of its own: %v", apart)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), "\x00--k3sm-kine-config=") {
		t.Fatalf("kube-apiserver (pid %d) is not started to serve kine: %q", pids[0], raw)
	}
	return pids[0]
}

func oneControllersProcess(t *testing.T, s *server) int {
	t.Helper()
	pids := s.childPids("kube-controllers")
	if len(pids) != 1 {
		t.Fatalf("kube-controllers processes: %v, want one", pids)
	}
	for _, role := range []string{"kube-scheduler", "kube-controller-manager"} {
		if apart := s.childPids(role); len(apart) != 0 {
			t.Fatalf("%s runs in a process of its own: %v", role, apart)
		}
	}
	return pids[0]
}

// healthz GETs a loopback /healthz verified against the server CA, as the
// supervisor's readiness check does.
func healthz(s *server, port int) error {
	pem, err := os.ReadFile(filepath.Join(s.dataDir, "server", "tls", "server-ca.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	resp, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d/healthz", port))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("127.0.0.1:%d/healthz: %s", port, resp.Status)
	}
	return nil
}

// listensOn reports whether pid holds the socket listening on 127.0.0.1:port.
func listensOn(t *testing.T, pid, port int) bool {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		t.Fatal(err)
	}
	inode := ""
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		// local_address 0100007F:PORT, state 0A (LISTEN), inode
		if len(f) > 9 && f[1] == fmt.Sprintf("0100007F:%04X", port) && f[3] == "0A" {
			inode = f[9]
		}
	}
	if inode == "" {
		return false
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && l == "socket:["+inode+"]" {
			return true
		}
	}
	return false
}

// TestBadInput: every refusal names the flag and leaves no server running.
func TestBadInput(t *testing.T) {
	run := func(t *testing.T, args ...string) string {
		t.Helper()
		cmd := exec.Command(k3smBin, args...)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("k3sm %v succeeded; want an error", args)
		}
		return string(out)
	}
	base := func(dir string) []string {
		return []string{"server", "--data-dir", dir, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
			"--https-listen-port", fmt.Sprint(freePort(t)), "--scheduler-port", fmt.Sprint(freePort(t)), "--controller-manager-port", fmt.Sprint(freePort(t))}
	}
	t.Run("overlapping CIDRs", func(t *testing.T) {
		out := run(t, append(base(t.TempDir()), "--service-cidr", "10.0.0.0/16", "--cluster-cidr", "10.0.0.0/8")...)
		if !strings.Contains(out, "--service-cidr") || !strings.Contains(out, "overlaps") {
			t.Fatalf("got: %s", out)
		}
	})
	t.Run("cluster-dns outside the service range", func(t *testing.T) {
		out := run(t, append(base(t.TempDir()), "--cluster-dns", "192.0.2.10")...)
		if !strings.Contains(out, "--cluster-dns") {
			t.Fatalf("got: %s", out)
		}
	})
	t.Run("unknown component flag", func(t *testing.T) {
		out := run(t, append(base(t.TempDir()), "--kube-controller-manager-arg", "no-such-flag=1")...)
		if !strings.Contains(out, "--kube-controller-manager-arg") || !strings.Contains(out, "kube-controller-manager has no flag --no-such-flag") {
			t.Fatalf("got: %s", out)
		}
	})
	// The scheduler and controller-manager share a process and its logger.
	t.Run("different process-wide flags", func(t *testing.T) {
		out := run(t, append(base(t.TempDir()), "--kube-scheduler-arg", "v=2", "--kube-controller-manager-arg", "v=4")...)
		if !strings.Contains(out, "--kube-scheduler-arg") || !strings.Contains(out, "run in one process") {
			t.Fatalf("got: %s", out)
		}
	})
	t.Run("data dir not writable", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "a-file")
		os.WriteFile(f, nil, 0o600)
		out := run(t, base(filepath.Join(f, "sub"))...)
		if !strings.Contains(out, "--data-dir") || !strings.Contains(out, "not writable") {
			t.Fatalf("got: %s", out)
		}
	})
	t.Run("port in use", func(t *testing.T) {
		s := newServer(t)
		busy := freePort(t)
		l, err := (&net.ListenConfig{}).Listen(ctx(t), "tcp", fmt.Sprintf("127.0.0.1:%d", busy))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		s.ports[0] = busy
		out := run(t, s.args()...)
		if !strings.Contains(out, "--https-listen-port") || !strings.Contains(out, "in use") {
			t.Fatalf("got: %s", out)
		}
	})
	t.Run("second server on the same data dir", func(t *testing.T) {
		s := newServer(t)
		s.start()
		other := newServer(t)
		other.dataDir = s.dataDir
		out := run(t, other.args()...)
		if !strings.Contains(out, "--data-dir") || !strings.Contains(out, "another k3sm server") {
			t.Fatalf("got: %s", out)
		}
		// The first server is unharmed.
		if _, err := s.client().CoreV1().Namespaces().Get(ctx(t), "default", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	})
}

// procStartTicks is a process's start time, in clock ticks after boot.
func procStartTicks(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name (which may hold spaces); starttime is
	// field 22, the 20th after it.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	v, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
