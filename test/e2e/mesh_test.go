package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

var meshPeerGVR = schema.GroupVersionResource{Group: "net.k3sm.io", Version: "v1", Resource: "meshpeers"}

// meshCluster is the three-node cluster of TestAgentJoin: the server's
// node and two agents, each in a network namespace of its own.
type meshCluster struct {
	s      *server
	c      kubernetes.Interface
	nodes  []string          // e2e-node, agent-1, agent-2
	netns  map[string]string // node -> its namespace ("" for the server's: the test's own)
	agents map[string]*agentProc
}

// exec runs prog in pod with args through kubectl exec.
func (m *meshCluster) exec(pod string, args ...string) (string, error) {
	return m.s.kubectl(append([]string{"exec", pod, "--", "prog"}, args...)...)
}

// spreadPods is the "spread" Deployment's Running pods by node.
func (m *meshCluster) spreadPods(t *testing.T) map[string]corev1.Pod {
	t.Helper()
	l, err := m.c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{LabelSelector: "app=spread"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil && running(&p) == nil && p.Status.PodIP != "" {
			out[p.Spec.NodeName] = p
		}
	}
	return out
}

// dialFrom: a connection from pod `from` to addr reaches a "serve" that
// reports the connection's source as fromIP and its destination as toIP.
func (m *meshCluster) dialFrom(from corev1.Pod, addr, toIP string) error {
	out, err := m.exec(from.Name, "dial:"+addr)
	if err != nil {
		return fmt.Errorf("%s (on %s) dial %s: %v: %s", from.Name, from.Spec.NodeName, addr, err, out)
	}
	want := fmt.Sprintf("from %s:", from.Status.PodIP)
	if !strings.Contains(out, want) || !strings.Contains(out, "to "+toIP+":") {
		return fmt.Errorf("%s (on %s) dial %s: got %q, want the source %s kept and the destination %s", from.Name, from.Spec.NodeName, addr, strings.TrimSpace(out), from.Status.PodIP, toIP)
	}
	return nil
}

// testMesh: pods on three nodes reach each other across the WireGuard
// mesh with their addresses kept, through a Service whose endpoints are
// all remote, by name from every node, through port-forward to an agent,
// and under a NetworkPolicy that sees remote pods' addresses; no private
// key is anywhere but its node's key file; a deleted node's MeshPeer and
// routes go everywhere.
func testMesh(t *testing.T, m *meshCluster) {
	dyn, err := dynamic.NewForConfig(m.s.restConfig())
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "spread"}
	spec := nativeSpec("e2e.local/prog:v1", "serve:8080", "forever")
	spec.Containers[0].ImagePullPolicy = corev1.PullNever
	spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
		WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}}
	if _, err := m.c.AppsV1().Deployments("default").Create(ctx(t), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "spread"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods map[string]corev1.Pod
	waitFor(t, 2*time.Minute, "one spread pod Running on each node", func() error {
		pods = m.spreadPods(t)
		if len(pods) != 3 {
			return fmt.Errorf("on %d nodes", len(pods))
		}
		return nil
	})

	// Every node wrote its MeshPeer, and reaches every other.
	waitFor(t, time.Minute, "three MeshPeers, each reachable", func() error {
		l, err := dyn.Resource(meshPeerGVR).List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) != 3 {
			return fmt.Errorf("%d MeshPeers", len(l.Items))
		}
		for _, p := range l.Items {
			if r, _, _ := unstructured.NestedBool(p.Object, "status", "reachable"); !r {
				return fmt.Errorf("MeshPeer %s not reachable: %v", p.GetName(), p.Object["status"])
			}
		}
		return nil
	})

	t.Run("pod to pod across nodes", func(t *testing.T) {
		for _, a := range m.nodes {
			for _, b := range m.nodes {
				if a == b {
					continue
				}
				to := pods[b].Status.PodIP
				waitFor(t, 30*time.Second, a+" to "+b, func() error { return m.dialFrom(pods[a], net.JoinHostPort(to, "8080"), to) })
			}
		}
	})

	t.Run("Service with remote endpoints, by name from every node", func(t *testing.T) {
		// Only agent-2's pod is an endpoint: remote from the other two.
		target := pods["agent-2"]
		if out, err := m.s.kubectl("label", "pod", target.Name, "mesh-target=yes"); err != nil {
			t.Fatalf("label: %v: %s", err, out)
		}
		svc, err := m.c.CoreV1().Services("default").Create(ctx(t), &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "remote"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"mesh-target": "yes"},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.c.CoreV1().Services("default").Delete(ctx(t), "remote", metav1.DeleteOptions{}) })
		for _, from := range []string{"e2e-node", "agent-1"} {
			waitFor(t, 30*time.Second, "the Service from "+from, func() error {
				return m.dialFrom(pods[from], net.JoinHostPort(svc.Spec.ClusterIP, "80"), target.Status.PodIP)
			})
		}
		for _, from := range m.nodes {
			waitFor(t, 30*time.Second, "DNS from "+from, func() error {
				out, err := m.exec(pods[from].Name, "lookup:remote.default.svc.cluster.local")
				if err != nil || !strings.Contains(out, svc.Spec.ClusterIP) {
					return fmt.Errorf("%v: %s", err, out)
				}
				return nil
			})
		}
	})

	t.Run("port-forward to a pod on an agent", func(t *testing.T) {
		local := freePort(t)
		pf := m.s.kubectlCmd("port-forward", "--address", "127.0.0.1", "pod/"+pods["agent-2"].Name, fmt.Sprintf("%d:8080", local))
		pout := &outBuf{}
		pf.Stdout, pf.Stderr = pout, pout
		if err := pf.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { pf.Process.Kill(); pf.Wait() }()
		pout.waitFor(t, fmt.Sprintf("Forwarding from 127.0.0.1:%d", local), 30*time.Second)
		waitFor(t, 30*time.Second, "a connection through port-forward", func() error {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", local), 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			b, _ := io.ReadAll(c)
			// The kubelet's port-forward connects to the port on the pod's
			// own loopback, inside its network namespace.
			if !strings.HasPrefix(string(b), "from 127.0.0.1:") || !strings.Contains(string(b), " to 127.0.0.1:8080") {
				return fmt.Errorf("got %q", b)
			}
			return nil
		})
	})

	t.Run("NetworkPolicy on traffic from remote pods", func(t *testing.T) {
		target := pods["agent-2"]
		addr := net.JoinHostPort(target.Status.PodIP, "8080")
		if out, err := m.s.kubectl("label", "pod", pods["e2e-node"].Name, "mesh-client=yes"); err != nil {
			t.Fatalf("label: %v: %s", err, out)
		}
		pol := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "mesh-only-client"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"mesh-target": "yes"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"mesh-client": "yes"}}}}}},
			},
		}
		np := m.c.NetworkingV1().NetworkPolicies("default")
		if _, err := np.Create(ctx(t), pol, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = np.Delete(ctx(t), pol.Name, metav1.DeleteOptions{}) })
		refused := func(from corev1.Pod) func() error {
			return func() error {
				if out, err := m.exec(from.Name, "dial:"+addr); err == nil {
					return fmt.Errorf("%s still connects: %s", from.Spec.NodeName, out)
				}
				return nil
			}
		}
		// A selector: the server node's pod is selected, agent-1's not.
		waitFor(t, 30*time.Second, "agent-1's pod refused", refused(pods["agent-1"]))
		if err := m.dialFrom(pods["e2e-node"], addr, target.Status.PodIP); err != nil {
			t.Fatalf("the selected remote pod: %v", err)
		}
		// An ipBlock of agent-1's pod address: now the other way round.
		pol, err := np.Get(ctx(t), pol.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pol.Spec.Ingress[0].From = []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: pods["agent-1"].Status.PodIP + "/32"}}}
		if _, err := np.Update(ctx(t), pol, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the server node's pod refused", refused(pods["e2e-node"]))
		if err := m.dialFrom(pods["agent-1"], addr, target.Status.PodIP); err != nil {
			t.Fatalf("the ipBlock's remote pod: %v", err)
		}
	})

	t.Run("a node writes only its own MeshPeer", func(t *testing.T) {
		// agent-1's own credential, as its node uses it.
		rc, err := clientcmd.BuildConfigFromFlags("", datadir.New(m.agents["agent-1"].dataDir).NodeKubeconfig())
		if err != nil {
			t.Fatal(err)
		}
		// It names the agent's balancer, on the agent's loopback: the
		// test reaches the server directly.
		rc.Host = m.s.restConfig().Host
		asNode, err := dynamic.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		peers := asNode.Resource(meshPeerGVR)
		other, err := peers.Get(ctx(t), "agent-2", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("a node reads the others' MeshPeers: %v", err)
		}
		if err := unstructured.SetNestedField(other.Object, "192.168.77.99:51820", "spec", "endpoint"); err != nil {
			t.Fatal(err)
		}
		if _, err := peers.Update(ctx(t), other, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only its own MeshPeer") {
			t.Errorf("agent-1 updating agent-2's MeshPeer: %v, want Forbidden by the policy", err)
		}
		if err := peers.Delete(ctx(t), "agent-2", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("agent-1 deleting agent-2's MeshPeer: %v, want Forbidden", err)
		}
		own, err := peers.Get(ctx(t), "agent-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := peers.Update(ctx(t), own, metav1.UpdateOptions{}); err != nil {
			t.Errorf("agent-1 updating its own MeshPeer: %v", err)
		}
	})

	t.Run("no private key leaves its node", func(t *testing.T) { checkNoPrivateKeys(t, m, dyn) })

	t.Run("a deleted node's peer goes everywhere", func(t *testing.T) {
		gone := "agent-2"
		l, err := dyn.Resource(meshPeerGVR).Get(ctx(t), gone, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cidr, _, _ := unstructured.NestedString(l.Object, "spec", "podCIDR")
		// Drained first, as an admin retires a node: its pods end there
		// and are replaced elsewhere once it is gone (the spread counts it
		// as a domain until then).
		if out, err := m.s.kubectl("drain", gone, "--force", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s"); err != nil {
			t.Fatalf("drain: %v: %s", err, out)
		}
		m.agents[gone].stop()
		if err := m.c.CoreV1().Nodes().Delete(ctx(t), gone, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "MeshPeer "+gone+" deleted with its Node", func() error {
			if _, err := dyn.Resource(meshPeerGVR).Get(ctx(t), gone, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
		for _, n := range []string{"e2e-node", "agent-1"} {
			waitFor(t, time.Minute, "no route to "+cidr+" on "+n, func() error {
				args := []string{"route", "show", cidr}
				if ns := m.netns[n]; ns != "" {
					args = append([]string{"-n", ns}, args...)
				}
				out, err := exec.Command("ip", args...).CombinedOutput()
				if err != nil || strings.TrimSpace(string(out)) != "" {
					return fmt.Errorf("%v: %s", err, out)
				}
				return nil
			})
		}
		waitFor(t, 2*time.Minute, "spread back to 3 Running pods on 2 nodes", func() error {
			l, err := m.c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{LabelSelector: "app=spread"})
			if err != nil {
				return err
			}
			n := 0
			for _, p := range l.Items {
				if p.Spec.NodeName == gone {
					return fmt.Errorf("pod %s still on %s", p.Name, gone)
				}
				if running(&p) == nil {
					n++
				}
			}
			if n != 3 {
				return fmt.Errorf("%d Running", n)
			}
			return nil
		})
	})
}

// checkNoPrivateKeys reads each node's private key from its key file and
// looks for it, in every encoding WireGuard's tools use, in every
// MeshPeer, Secret and ConfigMap, and in every file of every data dir
// (logs, state, role configs) but the key file itself.
func checkNoPrivateKeys(t *testing.T, m *meshCluster, dyn dynamic.Interface) {
	dirs := []string{m.s.dataDir}
	for _, a := range m.agents {
		dirs = append(dirs, a.dataDir)
	}
	var needles [][]byte
	keyFiles := map[string]bool{}
	for _, d := range dirs {
		files, _ := filepath.Glob(filepath.Join(d, "*", "mesh-keys", "*.key"))
		more, _ := filepath.Glob(filepath.Join(d, "*", "*", "mesh-keys", "*.key"))
		files = append(files, more...)
		if len(files) == 0 {
			t.Fatalf("no mesh key file under %s", d)
		}
		for _, f := range files {
			keyFiles[f] = true
			st, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("%s is %v, want 0600", f, st.Mode().Perm())
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			raw := bytes.TrimSpace(b)
			if dec, err := base64.StdEncoding.DecodeString(string(raw)); err == nil && len(dec) == 32 {
				raw = dec
			}
			if len(raw) != 32 {
				t.Fatalf("%s holds %d bytes, not a 32-byte key", f, len(raw))
			}
			needles = append(needles, raw, []byte(base64.StdEncoding.EncodeToString(raw)), []byte(hex.EncodeToString(raw)))
		}
	}
	look := func(where string, hay []byte) {
		for _, n := range needles {
			if bytes.Contains(hay, n) {
				t.Errorf("a private key is in %s", where)
			}
		}
	}
	peers, err := dyn.Resource(meshPeerGVR).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(peers)
	look("the MeshPeers", b)
	secrets, err := m.c.CoreV1().Secrets("").List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(secrets)
	look("the Secrets", b)
	cms, err := m.c.CoreV1().ConfigMaps("").List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(cms)
	look("the ConfigMaps", b)
	look("the server's output", []byte(m.s.output()))
	for _, a := range m.agents {
		look("an agent's output", []byte(a.out.String()))
	}
	for _, d := range dirs {
		filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
			if err != nil || fi.IsDir() && (fi.Name() == "pods" || fi.Name() == "images" || fi.Name() == "netns") {
				return filepath.SkipDir
			}
			if !fi.Mode().IsRegular() || keyFiles[p] || fi.Size() > 64<<20 {
				return nil
			}
			if b, err := os.ReadFile(p); err == nil {
				look(p, b)
			}
			return nil
		})
	}
}
