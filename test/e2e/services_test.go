package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// TestServicesAndDNS: a Deployment behind a ClusterIP Service is reached by
// its ClusterIP and its DNS names from a pod, through the node's own proxy
// and resolver (no kube-proxy, no CoreDNS).
func TestServicesAndDNS(t *testing.T) {
	requirePodNetwork(t)
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	s.deletePodsAtCleanup(t)

	labels := map[string]string{"app": "web"}
	spec := nativeSpec(imgs.prog, "serve:8080", "udpecho:5353", "forever")
	spec.TerminationGracePeriodSeconds = ptr.To[int64](1) // prog ignores SIGTERM
	spec.NodeSelector, spec.Tolerations = nil, nil        // a standard manifest
	spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1,
		ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}}}
	if _, err := c.AppsV1().Deployments("default").Create(ctx(t), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(5353)},
		}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := svc.Spec.ClusterIP

	var backends map[string]bool
	waitFor(t, 3*time.Minute, "two ready web pods", func() error {
		pods, err := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		backends = map[string]bool{}
		for _, p := range pods.Items {
			if podCondition(&p, corev1.PodReady) == corev1.ConditionTrue && p.Status.PodIP != "" {
				backends[p.Status.PodIP] = true
			}
		}
		if len(backends) != 2 {
			return fmt.Errorf("%d ready", len(backends))
		}
		return nil
	})

	client := nativePod("client", imgs.prog, "forever")
	client.Spec.NodeSelector, client.Spec.Tolerations = nil, nil
	s.createPod(t, client)
	waitPod(t, c, "client", 2*time.Minute, hasIP)

	// exec runs prog in the client pod and returns its output.
	exec := func(args ...string) (string, error) {
		return s.kubectl(append([]string{"exec", "client", "--", "prog"}, args...)...)
	}

	t.Run("ClusterIP and DNS names reach both replicas", func(t *testing.T) {
		for _, target := range []string{clusterIP, "web.default.svc.cluster.local", "web"} {
			seen := map[string]bool{}
			waitFor(t, 30*time.Second, "requests to "+target+" reach both replicas", func() error {
				out, err := exec("dial:" + target + ":80")
				if err != nil {
					return fmt.Errorf("%v: %s", err, out)
				}
				to := strings.TrimSpace(out[strings.LastIndex(out, " to ")+4:])
				ip := to[:strings.LastIndex(to, ":")]
				if !backends[ip] {
					return fmt.Errorf("answered by %q, not a web pod %v", ip, backends)
				}
				seen[ip] = true
				if len(seen) < 2 {
					return fmt.Errorf("only %v so far", seen)
				}
				return nil
			})
		}
	})

	t.Run("DNS records", func(t *testing.T) {
		out, err := exec("lookup:web.default.svc.cluster.local")
		if err != nil || strings.TrimSpace(out) != "lookup web.default.svc.cluster.local: "+clusterIP {
			t.Fatalf("A record: %v %q", err, out)
		}
		// The kubernetes Service, through the search path.
		api, err := c.CoreV1().Services("default").Get(ctx(t), "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out, err = exec("lookup:kubernetes.default")
		if err != nil || strings.TrimSpace(out) != "lookup kubernetes.default: "+api.Spec.ClusterIP {
			t.Fatalf("kubernetes.default: %v %q", err, out)
		}
		out, err = exec("lookup:nope.default.svc.cluster.local")
		if err == nil || !strings.Contains(out, "no such host") {
			t.Fatalf("a missing Service resolved: %v %q", err, out)
		}
	})

	t.Run("UDP Service", func(t *testing.T) {
		out, err := exec("udp:" + clusterIP + ":53:ping")
		if err != nil || strings.TrimSpace(out) != "echo ping" {
			t.Fatalf("UDP through the ClusterIP: %v %q", err, out)
		}
	})

	t.Run("scaling to 0 refuses, a new endpoint is used at once", func(t *testing.T) {
		scale := func(n int32) {
			sc, err := c.AppsV1().Deployments("default").GetScale(ctx(t), "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			sc.Spec.Replicas = n
			if _, err := c.AppsV1().Deployments("default").UpdateScale(ctx(t), "web", sc, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		scale(0)
		waitFor(t, time.Minute, "connection refused with no endpoints", func() error {
			out, err := exec("dial:" + clusterIP + ":80")
			if err == nil || !strings.Contains(out, "connection refused") {
				return fmt.Errorf("%v %q", err, out)
			}
			return nil
		})
		scale(1)
		waitFor(t, 2*time.Minute, "served again after scaling to 1", func() error {
			out, err := exec("dial:" + clusterIP + ":80")
			if err != nil || !strings.Contains(out, ":8080") {
				return fmt.Errorf("%v %q", err, out)
			}
			return nil
		})
	})
}
