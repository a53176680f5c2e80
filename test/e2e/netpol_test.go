package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestNetworkPolicy: the node enforces NetworkPolicies on its pods. A
// default-deny ingress policy blocks A → B (the node still reaches B), an
// allow from A's pods on 8080 lets it through (through B's ClusterIP
// Service too, which keeps A's address: a third pod C is refused there),
// an egress deny blocks B → A, and deleting the policies opens everything
// again.
func TestNetworkPolicy(t *testing.T) {
	requirePodNetwork(t)
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	s.deletePodsAtCleanup(t)
	nps := c.NetworkingV1().NetworkPolicies("default")
	t.Cleanup(func() { nps.DeleteCollection(ctx(t), metav1.DeleteOptions{}, metav1.ListOptions{}) })

	for _, name := range []string{"np-a", "np-b", "np-c"} {
		s.createPod(t, nativePod(name, imgs.prog, "serve:8080", "serve:8081", "forever"))
	}
	a := waitPod(t, c, "np-a", 2*time.Minute, hasIP)
	b := waitPod(t, c, "np-b", 2*time.Minute, hasIP)
	aIP, bIP := a.Status.PodIP, b.Status.PodIP
	waitPod(t, c, "np-c", 2*time.Minute, hasIP)
	svc, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "np-b"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"test": "np-b"}, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CoreV1().Services("default").Delete(ctx(t), "np-b", metav1.DeleteOptions{}) })
	svcAddr := net.JoinHostPort(svc.Spec.ClusterIP, "80")

	// dial reports whether pod from connects to ip:port (prog gives up
	// after 5 s).
	dial := func(from, ip string, port int) error {
		out, err := s.kubectl("exec", from, "--", "prog", fmt.Sprintf("dial:%s:%d", ip, port))
		if err != nil || !strings.Contains(out, fmt.Sprintf("to %s:%d", ip, port)) {
			return fmt.Errorf("%s → %s:%d: %v %q", from, ip, port, err, out)
		}
		return nil
	}
	reaches := func(from, ip string, port int) {
		t.Helper()
		waitFor(t, time.Minute, fmt.Sprintf("%s reaches %s:%d", from, ip, port), func() error { return dial(from, ip, port) })
	}
	blocked := func(from, ip string, port int) {
		t.Helper()
		waitFor(t, time.Minute, fmt.Sprintf("%s blocked from %s:%d", from, ip, port), func() error {
			if dial(from, ip, port) == nil {
				return fmt.Errorf("%s still reaches %s:%d", from, ip, port)
			}
			return nil
		})
	}
	create := func(np *networkingv1.NetworkPolicy) {
		t.Helper()
		if _, err := nps.Create(ctx(t), np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	selects := func(name string) metav1.LabelSelector {
		return metav1.LabelSelector{MatchLabels: map[string]string{"test": name}}
	}

	reaches("np-a", bIP, 8080)
	reaches("np-b", aIP, 8080)
	// viaService reports whether pod from reaches B through its ClusterIP,
	// and that B saw from's own pod address (fromIP).
	viaService := func(from, fromIP string) error {
		out, err := s.kubectl("exec", from, "--", "prog", "dial:"+svcAddr)
		if err != nil || !strings.Contains(out, "to "+bIP+":8080") {
			return fmt.Errorf("%s → Service %s: %v %q", from, svcAddr, err, out)
		}
		if !strings.Contains(out, "from "+fromIP+":") {
			return fmt.Errorf("through the Service B saw %q, not %s's pod address %s", out, from, fromIP)
		}
		return nil
	}
	cIP := waitPod(t, c, "np-c", time.Second, hasIP).Status.PodIP
	waitFor(t, time.Minute, "np-c reaches B through its Service", func() error { return viaService("np-c", cIP) })

	create(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "b-deny-ingress"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: selects("np-b"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}})
	blocked("np-a", bIP, 8080)
	// Traffic from the node itself (probes, the Service proxy) passes.
	if out, err := dialRead(net.JoinHostPort(bIP, "8080")); err != nil || !strings.Contains(out, "to "+bIP+":8080") {
		t.Fatalf("node → isolated pod: %v %q", err, out)
	}
	reaches("np-b", aIP, 8080) // B's egress is not isolated, and A's replies come back

	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(8080)
	selA := selects("np-a")
	create(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "b-allow-a-8080"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: selects("np-b"), Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &selA}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
		}}}})
	reaches("np-a", bIP, 8080)
	if err := dial("np-a", bIP, 8081); err == nil {
		t.Fatalf("np-a reaches %s:8081, which the policy does not allow", bIP)
	}
	// Through the Service the policy sees the real client: A passes, C not.
	waitFor(t, time.Minute, "np-a reaches B through its Service", func() error { return viaService("np-a", aIP) })
	if err := viaService("np-c", cIP); err == nil {
		t.Fatal("np-c reaches B through its Service, which B's policy does not allow")
	}

	create(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "b-deny-egress"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: selects("np-b"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}})
	blocked("np-b", aIP, 8080)
	reaches("np-a", bIP, 8080) // replies leave B despite its egress isolation

	if err := nps.DeleteCollection(ctx(t), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	reaches("np-b", aIP, 8080)
	reaches("np-a", bIP, 8081)
}
