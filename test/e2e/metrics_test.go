package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregator "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"
	"k8s.io/utils/ptr"
)

// TestMetricsAPI: with no add-on, metrics.k8s.io is registered and
// available, `kubectl top pod` shows a busy pod's CPU, `kubectl top node`
// works, RBAC's view role reads metrics and others may not, and an HPA on
// CPU gets a current utilization and scales up.
func TestMetricsAPI(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	agg, err := aggregator.NewForConfig(s.restConfig())
	if err != nil {
		t.Fatal(err)
	}
	mc, err := metricsclient.NewForConfig(s.restConfig())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("APIService available", func(t *testing.T) {
		waitFor(t, time.Minute, "APIService v1beta1.metrics.k8s.io Available", func() error {
			as, err := agg.ApiregistrationV1().APIServices().Get(ctx(t), "v1beta1.metrics.k8s.io", metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range as.Status.Conditions {
				if cond.Type == apiregv1.Available {
					if cond.Status == apiregv1.ConditionTrue {
						return nil
					}
					return fmt.Errorf("%s: %s", cond.Reason, cond.Message)
				}
			}
			return fmt.Errorf("no Available condition yet")
		})
	})

	busy := nativePod("busy", imgs.prog, "spin:30m")
	busy.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
	if _, err := c.CoreV1().Pods("default").Create(ctx(t), busy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, c, "busy", 2*time.Minute, running)

	t.Run("kubectl top pod shows CPU of a busy pod", func(t *testing.T) {
		row := regexp.MustCompile(`(?m)^busy\s+(\d+)m\s+(\d+)Mi\s*$`)
		var out string
		waitFor(t, 2*time.Minute, "kubectl top pod busy with CPU", func() error {
			var err error
			out, err = s.kubectl("top", "pod", "busy", "--namespace", "default")
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			m := row.FindStringSubmatch(out)
			if m == nil {
				return fmt.Errorf("no row for busy in %q", out)
			}
			if cpu, _ := strconv.Atoi(m[1]); cpu == 0 {
				return fmt.Errorf("zero CPU: %q", out)
			}
			return nil
		})
		t.Logf("kubectl top pod:\n%s", out)
		pm, err := mc.MetricsV1beta1().PodMetricses("default").Get(ctx(t), "busy", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pm.Window.Duration < 5*time.Second || pm.Timestamp.IsZero() || len(pm.Containers) != 1 || pm.Containers[0].Name != "main" {
			t.Fatalf("pod metrics: %+v", pm)
		}
		// A spinning goroutine is close to one core; allow for a loaded machine.
		if cpu := pm.Containers[0].Usage.Cpu().MilliValue(); cpu < 100 {
			t.Errorf("busy pod uses %dm CPU, expected most of a core", cpu)
		}
		if pm.Labels["test"] != "busy" {
			t.Errorf("pod metrics labels: %v", pm.Labels)
		}
		l, err := mc.MetricsV1beta1().PodMetricses("default").List(ctx(t), metav1.ListOptions{LabelSelector: "test=busy"})
		if err != nil || len(l.Items) != 1 {
			t.Fatalf("label selector: %+v %v", l, err)
		}
	})

	t.Run("kubectl top node", func(t *testing.T) {
		var out string
		waitFor(t, time.Minute, "kubectl top node", func() error {
			var err error
			out, err = s.kubectl("top", "node")
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			if !regexp.MustCompile(`(?m)^e2e-node\s+\d+m\s+\d+%\s+\d+Mi\s+\d+%`).MatchString(out) {
				return fmt.Errorf("no row for e2e-node in %q", out)
			}
			return nil
		})
		t.Logf("kubectl top node:\n%s", out)
		nm, err := mc.MetricsV1beta1().NodeMetricses().Get(ctx(t), "e2e-node", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The whole machine includes the busy pod.
		if nm.Usage.Cpu().MilliValue() < 100 || nm.Usage.Memory().Value() == 0 || nm.Labels["kubernetes.io/hostname"] != "e2e-node" {
			t.Fatalf("node metrics: %+v", nm)
		}
	})

	t.Run("kubelet API /metrics/resource", func(t *testing.T) {
		// As the apiserver (its kubelet-client certificate) would scrape it.
		tlsDir := filepath.Join(s.dataDir, "server", "tls")
		pair, err := tls.LoadX509KeyPair(filepath.Join(tlsDir, "client-kube-apiserver.crt"), filepath.Join(tlsDir, "client-kube-apiserver.key"))
		if err != nil {
			t.Fatal(err)
		}
		caPEM, err := os.ReadFile(filepath.Join(tlsDir, "server-ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(caPEM)
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}}}
		resp, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d/metrics/resource", s.ports[3]))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{
			`container_cpu_usage_seconds_total{container="main",namespace="default",pod="busy"} `,
			`container_memory_working_set_bytes{container="main",namespace="default",pod="busy"} `,
			`pod_cpu_usage_seconds_total{namespace="default",pod="busy"} `,
			"node_cpu_usage_seconds_total ", "node_memory_working_set_bytes ", "resource_scrape_error 0",
		} {
			if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
				t.Fatalf("%s: no %q in:\n%s", resp.Status, want, body)
			}
		}
	})

	t.Run("kubelet API: client certificate or bearer token, then nodes/* authorization", func(t *testing.T) {
		// As the kubelet: a client-CA certificate or a bearer token checked
		// with TokenReview; no credentials is 401; an identity without
		// nodes/proxy (the subresource of /pods) is 403.
		caPEM, err := os.ReadFile(filepath.Join(s.dataDir, "server", "tls", "server-ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(caPEM)
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
		get := func(token string) (int, string) {
			t.Helper()
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/pods", s.ports[3]), nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := get(""); code != http.StatusUnauthorized {
			t.Fatalf("no credentials: %d %s, want 401", code, body)
		}
		if code, body := get("not-a-token"); code != http.StatusUnauthorized {
			t.Fatalf("a bad token: %d %s, want 401", code, body)
		}
		token := func(sa string) string {
			t.Helper()
			if _, err := c.CoreV1().ServiceAccounts("default").Create(ctx(t), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			tr, err := c.CoreV1().ServiceAccounts("default").CreateToken(ctx(t), sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return tr.Status.Token
		}
		if code, body := get(token("no-rights")); code != http.StatusForbidden {
			t.Fatalf("a valid token without nodes/proxy: %d %s, want 403", code, body)
		}
		cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "kubelet-reader"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: []string{"get"}}}}
		if _, err := c.RbacV1().ClusterRoles().Create(ctx(t), cr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "kubelet-reader"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "kubelet-reader"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "kubelet-reader", Namespace: "default"}}}
		if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx(t), crb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		reader := token("kubelet-reader")
		waitFor(t, time.Minute, "a token with nodes/proxy to be allowed", func() error {
			if code, body := get(reader); code != http.StatusOK || !strings.Contains(body, `"busy"`) {
				return fmt.Errorf("%d %.200s", code, body)
			}
			return nil
		})
	})

	t.Run("RBAC: view reads metrics, others may not", func(t *testing.T) {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "viewer", Namespace: "default"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "view"},
			Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "viewer"}},
		}
		if _, err := c.RbacV1().RoleBindings("default").Create(ctx(t), rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "viewer runs kubectl top pod", func() error {
			out, err := s.kubectl("top", "pod", "busy", "--namespace", "default", "--as", "viewer")
			if err != nil || !strings.Contains(out, "busy") {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
		out, err := s.kubectl("top", "pod", "busy", "--namespace", "default", "--as", "nobody")
		if err == nil || !strings.Contains(out, "forbidden") {
			t.Fatalf("user without rights: %v: %s", err, out)
		}
	})

	t.Run("HPA on CPU", func(t *testing.T) {
		labels := map[string]string{"app": "spinner"}
		spec := nativeSpec(imgs.prog, "spin:30m")
		spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "spinner", Namespace: "default"},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
			},
		}
		if _, err := c.AppsV1().Deployments("default").Create(ctx(t), dep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		hpa := &autoscalingv2.HorizontalPodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Name: "spinner", Namespace: "default"},
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
				ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "spinner"},
				MinReplicas:    ptr.To[int32](1),
				MaxReplicas:    2,
				Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
					Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](50)}}}},
			},
		}
		if _, err := c.AutoscalingV2().HorizontalPodAutoscalers("default").Create(ctx(t), hpa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var got *autoscalingv2.HorizontalPodAutoscaler
		waitFor(t, 4*time.Minute, "HPA current CPU utilization", func() error {
			h, err := c.AutoscalingV2().HorizontalPodAutoscalers("default").Get(ctx(t), "spinner", metav1.GetOptions{})
			if err != nil {
				return err
			}
			got = h
			for _, m := range h.Status.CurrentMetrics {
				if m.Resource != nil && m.Resource.Name == corev1.ResourceCPU && m.Resource.Current.AverageUtilization != nil && *m.Resource.Current.AverageUtilization > 0 {
					return nil
				}
			}
			return fmt.Errorf("status %+v", h.Status)
		})
		u := *got.Status.CurrentMetrics[0].Resource.Current.AverageUtilization
		t.Logf("HPA current CPU utilization %d%%, desired replicas %d", u, got.Status.DesiredReplicas)
		// ~1 core against a 100m request is far above the 50% target.
		waitFor(t, 2*time.Minute, "HPA scales the deployment to 2", func() error {
			d, err := c.AppsV1().Deployments("default").Get(ctx(t), "spinner", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
				h, _ := c.AutoscalingV2().HorizontalPodAutoscalers("default").Get(ctx(t), "spinner", metav1.GetOptions{})
				return fmt.Errorf("deployment wants %v replicas; HPA status %+v", ptr.Deref(d.Spec.Replicas, 0), h.Status)
			}
			return nil
		})
	})
}
