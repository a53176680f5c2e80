package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	osexec "os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
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

	t.Run("the backend sees the client pod's address", func(t *testing.T) {
		clientIP := waitPod(t, c, "client", time.Second, hasIP).Status.PodIP
		out, err := exec("dial:" + net.JoinHostPort(clusterIP, "80"))
		if err != nil || !strings.Contains(out, "from "+clientIP+":") {
			t.Fatalf("through the ClusterIP the web pod saw %q (%v), want the client pod's %s", out, err, clientIP)
		}
		// The default mode on Linux as root, as k3sm status reports it.
		if st, _ := runExit(t, "status", "--data-dir", s.dataDir); !strings.Contains(st, "nftables DNAT") {
			t.Errorf("k3sm status does not name the nftables mode:\n%s", st)
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

	// externalIPs from TEST-NET-3 (203.0.113.0/24): the test runs in a
	// network namespace of its own with only lo and the node's pod network,
	// so a packet to them can only be answered by the node's DNAT or
	// refused; it has no route out of that namespace.
	t.Run("externalIPs", func(t *testing.T) {
		const served, empty = "203.0.113.10", "203.0.113.11"
		if out, err := osexec.Command("ip", "route", "get", served).CombinedOutput(); err == nil {
			t.Fatalf("the test's namespace has a route to %s (%s); its traffic could leave the node", served, out)
		}
		clientIP := waitPod(t, c, "client", time.Second, hasIP).Status.PodIP
		for name, sel := range map[string]map[string]string{"web-ext": labels, "none-ext": {"app": "none"}} {
			ip := served
			if name == "none-ext" {
				ip = empty
			}
			_, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.ServiceSpec{Selector: sel, ExternalIPs: []string{ip},
					Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.CoreV1().Services("default").Delete(context.Background(), name, metav1.DeleteOptions{}) })
		}
		// In the kernel: the backend sees the client pod itself (the relay
		// would show the gateway), through the node's DNAT.
		waitFor(t, 30*time.Second, "the externalIP answered by a web pod", func() error {
			out, err := exec("dial:" + served + ":80")
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			if !strings.Contains(out, "from "+clientIP+":") || !strings.Contains(out, ":8080") {
				return fmt.Errorf("answered %q, want a web pod seeing the client %s", out, clientIP)
			}
			return nil
		})
		// Until the node has the rule, a connection to empty would be
		// routed to the veth below: wait for it first.
		waitFor(t, 30*time.Second, empty+" in the kernel's no-endpoints map", func() error {
			return servicesMapHas("no-endpoints", netip.MustParseAddr(empty))
		})
		if err := servicesMapHas("services", netip.MustParseAddr(served)); err != nil {
			t.Fatal(err)
		}
		// No endpoints: refused at the node (the forward rule), not routed
		// on. A real node has a route for it; here TEST-NET-3 gets one into
		// a veth pair whose both ends are in the test's namespace, where
		// nobody answers, so nothing can leave even if the rule were
		// missing, and the veth's counter shows whether anything was
		// routed there (an ARP request at least).
		const dev, peer = "k3sme2e0", "k3sme2e1"
		if out, err := osexec.Command("ip", "link", "add", dev, "type", "veth", "peer", "name", peer).CombinedOutput(); err != nil {
			t.Fatalf("a veth pair for a route to %s: %v: %s", empty, err, out)
		}
		t.Cleanup(func() { osexec.Command("ip", "link", "del", dev).Run() })
		for _, d := range []string{dev, peer} { // no router solicitations in the counter
			os.WriteFile("/proc/sys/net/ipv6/conf/"+d+"/disable_ipv6", []byte("1"), 0o644)
		}
		for _, args := range [][]string{{"link", "set", peer, "up"}, {"link", "set", dev, "up"}, {"route", "add", "203.0.113.0/24", "dev", dev}} {
			if out, err := osexec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %v: %v: %s", args, err, out)
			}
		}
		before := txPackets(t, dev)
		waitFor(t, 30*time.Second, "an externalIP without endpoints refused", func() error {
			out, err := exec("dial:" + empty + ":80")
			if err == nil || !strings.Contains(out, "connection refused") {
				return fmt.Errorf("%v %q", err, out)
			}
			return nil
		})
		if after := txPackets(t, dev); after != before {
			t.Errorf("%d packets were routed out towards %s although the node refuses it", after-before, empty)
		}
		if err := servicesChainExists("forward"); err != nil {
			t.Error(err)
		}
	})

	// A client beyond the node: a network namespace the test makes (an
	// unshared sleep), linked to the test's namespace by a veth as a node's
	// uplink would be (192.0.2.1 the node, 192.0.2.2 the client), reaches
	// externalIPs routed to the node. The node address is 127.0.0.1 here,
	// so NodePort and LoadBalancer stay on the relay; an externalIP takes
	// the same kernel path and masquerade exemption (the netns test
	// TestServicesNodePortLocal covers a nodePort).
	t.Run("externalTrafficPolicy Local keeps the address of a client beyond the node", func(t *testing.T) {
		const local, cluster, client = "203.0.113.20", "203.0.113.21", "192.0.2.2"
		for name, ip := range map[string]string{"web-ext-local": local, "web-ext-cluster": cluster} {
			spec := corev1.ServiceSpec{Selector: labels, ExternalIPs: []string{ip},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}
			if ip == local {
				spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}
			if _, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.CoreV1().Services("default").Delete(context.Background(), name, metav1.DeleteOptions{}) })
		}
		nodes, err := c.CoreV1().Nodes().List(ctx(t), metav1.ListOptions{})
		if err != nil || len(nodes.Items) != 1 {
			t.Fatalf("nodes: %v", err)
		}
		podCIDR := netip.MustParsePrefix(nodes.Items[0].Spec.PodCIDR)
		gateway := podCIDR.Addr().Next()
		ns := clientNetNS(t, "k3sme2eu0", "192.0.2.1", client)
		waitFor(t, 30*time.Second, "a web pod sees the client's own address through the Local externalIP", func() error {
			out, err := dialReadIn(ns, local+":80")
			if err != nil || !strings.Contains(out, "from "+client+":") || !strings.Contains(out, ":8080") {
				return fmt.Errorf("%v %q", err, out)
			}
			return nil
		})
		waitFor(t, 30*time.Second, "a web pod sees the gateway through the Cluster externalIP", func() error {
			out, err := dialReadIn(ns, cluster+":80")
			if err != nil || !strings.Contains(out, "from "+gateway.String()+":") || !strings.Contains(out, ":8080") {
				return fmt.Errorf("%v %q, want a web pod seeing %s (masqueraded)", err, out, gateway)
			}
			return nil
		})
	})

	t.Run("a web tier calls its backend by DNS name", func(t *testing.T) {
		front := nativeSpec(imgs.prog, "relay:8080:web:80", "forever")
		front.NodeSelector, front.Tolerations = nil, nil
		fl := map[string]string{"app": "front"}
		fd := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "front"}, Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: fl},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: fl}, Spec: front}}}
		if _, err := c.AppsV1().Deployments("default").Create(ctx(t), fd, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "front"},
			Spec: corev1.ServiceSpec{Selector: fl, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "client → front → web", func() error {
			out, err := exec("dial:front:80")
			if err != nil || !strings.HasPrefix(out, "relay ") || !strings.Contains(out, "got: from ") || !strings.Contains(out, ":8080") {
				return fmt.Errorf("%v %q", err, out)
			}
			return nil
		})
	})

	t.Run("NodePort and LoadBalancer on the node's address", func(t *testing.T) {
		np, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web-np"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: labels,
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodePort := np.Spec.Ports[0].NodePort
		waitFor(t, 30*time.Second, "NodePort answers on the node", func() error {
			out, err := dialRead(fmt.Sprintf("127.0.0.1:%d", nodePort))
			if err != nil || !strings.Contains(out, ":8080") {
				return fmt.Errorf("%v %q", err, out)
			}
			return nil
		})
		lbPort := int32(freePort(t))
		if _, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web-lb"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: labels,
				Ports: []corev1.ServicePort{{Port: lbPort, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "LoadBalancer ingress is the node's address", func() error {
			lb, err := c.CoreV1().Services("default").Get(ctx(t), "web-lb", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if in := lb.Status.LoadBalancer.Ingress; len(in) != 1 || in[0].IP != "127.0.0.1" {
				return fmt.Errorf("ingress %+v", in)
			}
			out, err := dialRead(fmt.Sprintf("127.0.0.1:%d", lbPort))
			if err != nil || !strings.Contains(out, ":8080") {
				return fmt.Errorf("%v %q", err, out)
			}
			return nil
		})
	})

	t.Run("session affinity sticks to one replica", func(t *testing.T) {
		aff, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web-sticky"},
			Spec: corev1.ServiceSpec{Selector: labels, SessionAffinity: corev1.ServiceAffinityClientIP,
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for range 6 {
			var out string
			waitFor(t, 30*time.Second, "sticky Service answers", func() error {
				var err error
				out, err = exec("dial:" + aff.Spec.ClusterIP + ":80")
				return err
			})
			seen[out[strings.LastIndex(out, " to "):]] = true
		}
		if len(seen) != 1 {
			t.Fatalf("ClientIP affinity reached %d replicas: %v", len(seen), seen)
		}
	})

	t.Run("a headless StatefulSet gets per-pod names", func(t *testing.T) {
		dbl := map[string]string{"app": "db"}
		if _, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "db"},
			Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: dbl,
				Ports: []corev1.ServicePort{{Name: "tcp", Port: 8080}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		dbSpec := nativeSpec(imgs.prog, "serve:8080", "forever")
		dbSpec.NodeSelector, dbSpec.Tolerations = nil, nil
		dbSpec.TerminationGracePeriodSeconds = ptr.To[int64](1)
		ss := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: appsv1.StatefulSetSpec{
			ServiceName: "db", Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: dbl},
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template:            corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: dbl}, Spec: dbSpec}}}
		if _, err := c.AppsV1().StatefulSets("default").Create(ctx(t), ss, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"db-0", "db-1"} {
			p := waitPod(t, c, name, 2*time.Minute, hasIP)
			waitFor(t, time.Minute, name+".db resolves to its pod", func() error {
				out, err := exec("lookup:" + name + ".db.default.svc.cluster.local")
				if err != nil || strings.TrimSpace(out) != "lookup "+name+".db.default.svc.cluster.local: "+p.Status.PodIP {
					return fmt.Errorf("%v %q (pod IP %s)", err, out, p.Status.PodIP)
				}
				return nil
			})
		}
		out, err := exec("lookup:db")
		if err != nil || len(strings.Fields(out)) != 4 {
			t.Fatalf("headless db: %v %q, want both pods' addresses", err, out)
		}
	})

	t.Run("native pods resolve through glibc (getent)", func(t *testing.T) {
		if _, err := os.Stat("/usr/bin/getent"); err != nil {
			t.Skip("no getent on this host")
		}
		nat := nativePod("native-dns", "native", "/bin/sleep", "infinity")
		nat.Spec.Containers[0].Args = nil
		nat.Spec.Containers[0].Command = []string{"/bin/sleep", "infinity"}
		nat.Spec.NodeSelector, nat.Spec.Tolerations = nil, nil
		s.createPod(t, nat)
		waitPod(t, c, "native-dns", 2*time.Minute, hasIP)
		api, _ := c.CoreV1().Services("default").Get(ctx(t), "kubernetes", metav1.GetOptions{})
		out, err := s.kubectl("exec", "native-dns", "--", "getent", "hosts", "kubernetes.default")
		if err != nil || !strings.HasPrefix(out, api.Spec.ClusterIP+" ") {
			t.Fatalf("getent hosts kubernetes.default: %v %q (want %s)", err, out, api.Spec.ClusterIP)
		}
	})

	t.Run("service links in env", func(t *testing.T) {
		p := nativePod("links", imgs.prog, "env:WEB_SERVICE_HOST", "env:WEB_SERVICE_PORT_HTTP", "env:KUBERNETES_SERVICE_HOST", "forever")
		p.Spec.NodeSelector, p.Spec.Tolerations = nil, nil
		s.createPod(t, p)
		waitPod(t, c, "links", 2*time.Minute, running)
		api, _ := c.CoreV1().Services("default").Get(ctx(t), "kubernetes", metav1.GetOptions{})
		waitLogs(t, s, "links", "WEB_SERVICE_HOST="+clusterIP+"\n")
		waitLogs(t, s, "links", "WEB_SERVICE_PORT_HTTP=80\n")
		waitLogs(t, s, "links", "KUBERNETES_SERVICE_HOST="+api.Spec.ClusterIP+"\n")
	})

	t.Run("every DNS record kind", func(t *testing.T) {
		// dig-like checks from the node (this test's network namespace)
		// against the cluster DNS; the Services and pods are the ones the
		// subtests above made.
		if _, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "alias"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "web.default.svc.cluster.local"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		clientIP := waitPod(t, c, "client", time.Second, hasIP).Status.PodIP
		db0 := waitPod(t, c, "db-0", time.Second, hasIP).Status.PodIP
		db1 := waitPod(t, c, "db-1", time.Second, hasIP).Status.PodIP
		var webIP string
		for ip := range backends {
			webIP = ip
		}
		const z = ".cluster.local."
		ok := func(answer ...string) dnsAnswer { return dnsAnswer{answer: answer} }
		for _, tc := range []struct {
			name  string
			qtype uint16
			want  dnsAnswer
		}{
			{"web.default.svc" + z, dns.TypeA, ok("A " + clusterIP)},
			// Headless: one A per ready endpoint, and per-pod names.
			{"db.default.svc" + z, dns.TypeA, ok("A "+db0, "A "+db1)},
			{"db-0.db.default.svc" + z, dns.TypeA, ok("A " + db0)},
			// SRV of a named port: the Service name, its port.
			{"_http._tcp.web.default.svc" + z, dns.TypeSRV, ok("SRV 0 100 80 web.default.svc.cluster.local.")},
			{"_tcp._tcp.db.default.svc" + z, dns.TypeSRV, ok("SRV 0 50 8080 db-0.db.default.svc.cluster.local.", "SRV 0 50 8080 db-1.db.default.svc.cluster.local.")},
			// PTR: a ClusterIP names its Service; an endpoint address its
			// name under each Service it backs (web's pods back web-np,
			// web-lb and web-sticky too); a pod that backs none its pod
			// record; an address in the ranges nobody has is NXDOMAIN
			// from here, not asked of the host's resolvers.
			{reverseName(t, clusterIP), dns.TypePTR, ok("PTR web.default.svc.cluster.local.")},
			{reverseName(t, db0), dns.TypePTR, ok("PTR db-0.db.default.svc.cluster.local.")},
			{reverseName(t, webIP), dns.TypePTR, dnsAnswer{answer: []string{"PTR " + dashedIP(webIP) + ".web.default.svc.cluster.local."}, contains: true}},
			{dashedIP(webIP) + ".web.default.svc" + z, dns.TypeA, ok("A " + webIP)},
			{reverseName(t, clientIP), dns.TypePTR, ok("PTR " + dashedIP(clientIP) + ".default.pod.cluster.local.")},
			{reverseName(t, "100.127.255.253"), dns.TypePTR, dnsAnswer{rcode: dns.RcodeNameError, soa: true}},
			{reverseName(t, "10.43.255.253"), dns.TypePTR, dnsAnswer{rcode: dns.RcodeNameError, soa: true}},
			// Pod records.
			{dashedIP(clientIP) + ".default.pod" + z, dns.TypeA, ok("A " + clientIP)},
			// ExternalName: a CNAME, followed inside the zone.
			{"alias.default.svc" + z, dns.TypeCNAME, ok("CNAME web.default.svc.cluster.local.")},
			{"alias.default.svc" + z, dns.TypeA, ok("CNAME web.default.svc.cluster.local.", "A "+clusterIP)},
			{"dns-version" + z, dns.TypeTXT, ok(`TXT "1.1.0"`)},
			// Negative answers as the specification says: NXDOMAIN for a
			// missing Service, NODATA for a type a Service has not.
			{"nope.default.svc" + z, dns.TypeA, dnsAnswer{rcode: dns.RcodeNameError, soa: true}},
			{"web.default.svc" + z, dns.TypeAAAA, dnsAnswer{soa: true}},
		} {
			expectDNS(t, tc.name, tc.qtype, tc.want)
		}
	})

	t.Run("a new endpoint is used within 1 s of being ready", func(t *testing.T) {
		fl := map[string]string{"app": "fresh"}
		fresh, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "fresh"},
			Spec: corev1.ServiceSpec{Selector: fl, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		addr := net.JoinHostPort(fresh.Spec.ClusterIP, "80")
		// The node reaches ClusterIPs (as kube-proxy's nodes do): the web
		// Service first, so a failure below is about the new endpoint.
		waitFor(t, 30*time.Second, "the node reaches the web ClusterIP", func() error {
			out, err := dialRead(net.JoinHostPort(clusterIP, "80"))
			if err != nil || !strings.Contains(out, ":8080") {
				return fmt.Errorf("%v %q", err, out)
			}
			return nil
		})
		ip, ready := endpointReady(t, c, "fresh", "fresh", func() {
			p := nativePod("fresh", imgs.prog, "serve:8080", "forever")
			p.Labels = fl
			p.Spec.NodeSelector, p.Spec.Tolerations = nil, nil
			p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
			p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1,
				ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}}
			s.createPod(t, p)
		})
		served, err := firstAnswerFrom(addr, ip, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		delay := served.Sub(ready)
		t.Logf("the new endpoint %s served through %s %s after the test saw it ready in its EndpointSlice", ip, addr, delay.Round(time.Millisecond))
		if delay > time.Second {
			t.Fatalf("the new endpoint was used %s after it was ready, want within 1s", delay)
		}
	})

	t.Run("scaling to 0 refuses, a new endpoint is used at once", func(t *testing.T) {
		scale := func(n int32) { setScale(t, c, "web", n) }
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

// txPackets is the transmit packet count of a device of this namespace
// (/proc/net/dev, which, unlike /sys, follows the network namespace).
func txPackets(t *testing.T, dev string) int64 {
	t.Helper()
	// This thread's namespace: /proc/net follows the main thread, which
	// inNetNS may have left in a pod's namespace for good.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b, err := os.ReadFile("/proc/thread-self/net/dev")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, stats, ok := strings.Cut(line, ":")
		if f := strings.Fields(stats); ok && strings.TrimSpace(name) == dev && len(f) >= 10 {
			n, err := strconv.ParseInt(f[9], 10, 64)
			if err != nil {
				t.Fatalf("/proc/net/dev: %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/net/dev", dev)
	return 0
}

// TestServiceProxyUserspace: --service-proxy=userspace keeps the relay for
// ClusterIPs: the Service still answers, the backend sees the node's
// gateway (the relay's dial), not the client, and k3sm status says so.
func TestServiceProxyUserspace(t *testing.T) {
	requirePodNetwork(t)
	imgs := buildImages(t)
	s := newServer(t, "--service-proxy=userspace")
	s.start()
	c := s.client()
	s.deletePodsAtCleanup(t)
	s.createPod(t, nativePod("us-web", imgs.prog, "serve:8080", "forever"))
	s.createPod(t, nativePod("us-client", imgs.prog, "forever"))
	waitPod(t, c, "us-web", 2*time.Minute, hasIP)
	clientIP := waitPod(t, c, "us-client", 2*time.Minute, hasIP).Status.PodIP
	svc, err := c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "us-web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"test": "us-web"}, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out string
	waitFor(t, time.Minute, "the relay serves the ClusterIP", func() error {
		out, err = s.kubectl("exec", "us-client", "--", "prog", "dial:"+net.JoinHostPort(svc.Spec.ClusterIP, "80"))
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if strings.Contains(out, "from "+clientIP+":") || !strings.Contains(out, "from ") {
		t.Fatalf("through the relay the backend saw %q; want the node's gateway, not the client %s", out, clientIP)
	}
	if st, _ := runExit(t, "status", "--data-dir", s.dataDir); !strings.Contains(st, "userspace relay") {
		t.Errorf("k3sm status does not name the userspace mode:\n%s", st)
	}
}

// clientNetNS makes a network namespace (an unshared sleep, ended at
// cleanup) linked to this one by a veth: dev with nodeAddr/24 here, eth0
// with clientAddr/24 there, its default route through nodeAddr. It
// returns the namespace's file.
func clientNetNS(t *testing.T, dev, nodeAddr, clientAddr string) string {
	t.Helper()
	sleep := osexec.Command("unshare", "--net", "sleep", "600")
	if err := sleep.Start(); err != nil {
		t.Fatalf("unshare --net: %v", err)
	}
	t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
	pid := strconv.Itoa(sleep.Process.Pid)
	ns := "/proc/" + pid + "/ns/net"
	self, _ := os.Readlink("/proc/self/ns/net")
	waitFor(t, 5*time.Second, "the client's own network namespace", func() error {
		if there, err := os.Readlink(ns); err != nil || there == self {
			return fmt.Errorf("%s is %q (%v), this one %q", ns, there, err, self)
		}
		return nil
	})
	t.Cleanup(func() { osexec.Command("ip", "link", "del", dev).Run() })
	in := []string{"nsenter", "-t", pid, "-n", "ip"}
	for _, argv := range [][]string{
		{"ip", "link", "add", dev, "type", "veth", "peer", "name", "eth0", "netns", pid},
		{"ip", "addr", "add", nodeAddr + "/24", "dev", dev},
		{"ip", "link", "set", dev, "up"},
		append(in, "link", "set", "lo", "up"),
		append(in, "addr", "add", clientAddr+"/24", "dev", "eth0"),
		append(in, "link", "set", "eth0", "up"),
		append(in, "route", "add", "default", "via", nodeAddr),
	} {
		if out, err := osexec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", argv, err, out)
		}
	}
	return ns
}

// dialReadIn is dialRead from inside the network namespace at ns.
func dialReadIn(ns, addr string) (out string, err error) {
	err = inNetNS(ns, func() (err error) {
		out, err = dialRead(addr)
		return err
	})
	return out, err
}
