package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// nodeNet is a network namespace of the test's own, one node's "machine",
// joined to the test's namespace (where the server runs) by a bridge the
// test makes: the test's end hostIP on the bridge, the namespace's nsIP
// (192.168.77.0/24 exists only on that bridge).
type nodeNet struct {
	name, hostIP, nsIP string
}

// newNodeNets makes n node namespaces on one bridge, so that they reach
// the server and each other.
func newNodeNets(t *testing.T, n int) []*nodeNet {
	t.Helper()
	return newNodeNetsOn(t, 77, n)
}

// newNodeNetsOn makes n node namespaces on a bridge of their own, on
// 192.168.<subnet>.0/24: tests running side by side each take a subnet.
func newNodeNetsOn(t *testing.T, subnet, n int) []*nodeNet {
	t.Helper()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	br, hostIP := fmt.Sprintf("k3sme2ebr%d", subnet), fmt.Sprintf("192.168.%d.1", subnet)
	run("link", "add", br, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", br).Run() })
	run("addr", "add", hostIP+"/24", "dev", br)
	run("link", "set", br, "up")
	var nets []*nodeNet
	for i := range n {
		nn := &nodeNet{name: fmt.Sprintf("k3sm-e2e-%d-%d-%d", os.Getpid(), subnet, i), hostIP: hostIP, nsIP: fmt.Sprintf("192.168.%d.%d", subnet, i+2)}
		host := fmt.Sprintf("k3sme2e%d-%d", subnet, i)
		run("netns", "add", nn.name)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", nn.name).Run() })
		run("link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", nn.name)
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() })
		run("link", "set", host, "master", br)
		run("link", "set", host, "up")
		run("-n", nn.name, "addr", "add", nn.nsIP+"/24", "dev", "eth0")
		run("-n", nn.name, "link", "set", "eth0", "up")
		run("-n", nn.name, "link", "set", "lo", "up")
		nets = append(nets, nn)
	}
	return nets
}

// agentProc is one `k3sm agent` in a node namespace.
type agentProc struct {
	t       *testing.T
	dataDir string
	args    []string
	ns      string
	cmd     *exec.Cmd
	out     *lockedWriter
	done    chan error
}

func (a *agentProc) start() {
	a.t.Helper()
	a.cmd = exec.Command("ip", append([]string{"netns", "exec", a.ns, k3smBin, "agent", "--data-dir", a.dataDir}, a.args...)...)
	a.out = &lockedWriter{w: &bytes.Buffer{}}
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	if err := a.cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	a.done = make(chan error, 1)
	go func() { a.done <- a.cmd.Wait() }()
}

// run starts the agent and returns its output once it exits (a refusal).
func (a *agentProc) run() (string, error) {
	a.start()
	select {
	case err := <-a.done:
		return a.out.String(), err
	case <-time.After(time.Minute):
		a.stop()
		return a.out.String(), fmt.Errorf("k3sm agent still running after 1m")
	}
}

func (a *agentProc) waitUp() {
	a.t.Helper()
	deadline := time.After(2 * time.Minute)
	for !strings.Contains(a.out.String(), "k3sm agent is up") {
		select {
		case err := <-a.done:
			a.done <- err
			a.t.Fatalf("agent exited before it was up (%v):\n%s", err, a.out.String())
		case <-deadline:
			a.t.Fatalf("agent not up after 2m:\n%s", a.out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (a *agentProc) stop() {
	if a.cmd == nil || a.cmd.Process == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(time.Minute):
		a.t.Errorf("agent did not stop within 1m after SIGTERM")
		_ = a.cmd.Process.Kill()
		<-a.done
	}
	a.cmd = nil
}

// loadProgImage loads e2e.local/prog:v1 (progImage) into the image store
// of each data dir (an agent's loopback is not the test's, where the test
// registry listens) and returns the image's tarball.
func loadProgImage(t *testing.T, dataDirs ...string) string {
	t.Helper()
	imgTar := filepath.Join(t.TempDir(), "prog.tar")
	ref, err := name.ParseReference("e2e.local/prog:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(imgTar, ref, progImage(t)); err != nil {
		t.Fatal(err)
	}
	for _, dir := range dataDirs {
		if out, err := exec.Command(k3smBin, "image", "load", "--data-dir", dir, "-i", imgTar).CombinedOutput(); err != nil {
			t.Fatalf("k3sm image load: %v\n%s", err, out)
		}
	}
	return imgTar
}

// joinedFiles are what a join leaves in an agent's data dir: none of them
// may exist after a refused one.
func joinedFiles(dir string) []string {
	var found []string
	for _, p := range []string{"agent/tls", "agent/node.kubeconfig", "agent/node-password", "agent/join.json"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err == nil {
			found = append(found, p)
		}
	}
	return found
}

// TestAgentJoin: a second machine (a network namespace joined to the
// server's by a veth pair) joins with `k3sm token create`'s token, runs a
// pod that kubectl logs and exec reach through its kubelet API, and
// survives its own restart with the pod untouched; wrong CA hashes,
// deleted tokens and a taken node name are refused, leaving nothing.
func TestAgentJoin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent runs in a network namespace of its own")
	}
	nets := newNodeNets(t, 2)
	nn := nets[0]
	supPort := freePort(t)
	// A lost node is NotReady after 20 s, not upstream's 50 s.
	s := newServer(t, "--bind-address", "0.0.0.0", "--advertise-address", nn.hostIP, "--supervisor-port", strconv.Itoa(supPort),
		"--kube-controller-manager-arg=node-monitor-grace-period=20s")
	s.defaultAddrs = true
	s.start()
	c := s.client()
	server := fmt.Sprintf("https://%s:%d", nn.hostIP, supPort)

	token := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(k3smBin, append([]string{"token", "--data-dir", s.dataDir}, args...)...).Output()
		if err != nil {
			t.Fatalf("k3sm token %v: %v", args, err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return lines[len(lines)-1]
	}
	tok := token("create", "--description", "e2e")
	if !strings.HasPrefix(tok, "K10") {
		t.Fatalf("token create printed %q", tok)
	}
	if out := token("list"); !strings.Contains(out, tok[strings.Index(tok, "::")+2:][:6]) {
		t.Fatalf("token list does not show the token's id:\n%s", out)
	}
	revoked := token("create")
	token("delete", revoked)
	kubeletPort := strconv.Itoa(freePort(t))
	agentArgs := func(tok, node string) []string {
		return []string{"--server", server, "--token", tok, "--node-name", node, "--kubelet-port", kubeletPort, testEvictionHard}
	}

	refusals := []struct {
		name, tok, node, want string
	}{
		{"wrong CA hash", "K10" + strings.Repeat("0", 64) + tok[strings.Index(tok, "::"):], "refused-1", "not the one the token pins"},
		{"deleted token", revoked, "refused-2", "not valid"},
	}
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			a := &agentProc{t: t, dataDir: newDataDir(t, "k3sm-e2e-agent-"), ns: nn.name, args: agentArgs(r.tok, r.node)}
			out, err := a.run()
			if err == nil || !strings.Contains(out, r.want) {
				t.Fatalf("agent: %v, want a refusal saying %q:\n%s", err, r.want, out)
			}
			if f := joinedFiles(a.dataDir); len(f) > 0 {
				t.Errorf("a refused join left %v", f)
			}
			if _, err := c.CoreV1().Secrets("kube-system").Get(ctx(t), r.node+".node-password.k3sm", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("a refused join stored a node password (%v)", err)
			}
		})
	}

	// The agent's image is loaded into its store beforehand: its loopback
	// is not the test's, where the test registry listens.
	agentDir := newDataDir(t, "k3sm-e2e-agent-")
	imgTar := loadProgImage(t, agentDir, s.dataDir)

	a := &agentProc{t: t, dataDir: agentDir, ns: nn.name, args: agentArgs(tok, "agent-1")}
	a.start()
	t.Cleanup(a.stop)
	a.waitUp()
	waitFor(t, time.Minute, "node agent-1 Ready", func() error {
		n, err := c.CoreV1().Nodes().Get(ctx(t), "agent-1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ip := n.Status.Addresses[0].Address; ip != nn.nsIP {
			return fmt.Errorf("address %s, want %s", ip, nn.nsIP)
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("not Ready: %+v", n.Status.Conditions)
	})

	t.Run("name taken", func(t *testing.T) {
		b := &agentProc{t: t, dataDir: newDataDir(t, "k3sm-e2e-agent-"), ns: nn.name, args: agentArgs(tok, "agent-1")}
		out, err := b.run()
		if err == nil || !strings.Contains(out, "taken by another node") {
			t.Fatalf("second agent-1: %v, want a refusal saying the name is taken:\n%s", err, out)
		}
		if f := joinedFiles(b.dataDir); len(f) > 0 {
			t.Errorf("a refused join left %v", f)
		}
	})

	s.deletePodsAtCleanup(t)
	t.Cleanup(func() {
		_ = c.AppsV1().Deployments("default").Delete(context.Background(), "spread", metav1.DeleteOptions{})
	})

	// A third node, for the mesh: agent-2 on the same bridge.
	agent2Dir := newDataDir(t, "k3sm-e2e-agent-")
	if out, err := exec.Command(k3smBin, "image", "load", "--data-dir", agent2Dir, "-i", imgTar).CombinedOutput(); err != nil {
		t.Fatalf("k3sm image load: %v\n%s", err, out)
	}
	a2 := &agentProc{t: t, dataDir: agent2Dir, ns: nets[1].name, args: agentArgs(tok, "agent-2")}
	a2.start()
	t.Cleanup(a2.stop)
	a2.waitUp()
	mc := &meshCluster{s: s, c: c, nodes: []string{"e2e-node", "agent-1", "agent-2"},
		netns:  map[string]string{"agent-1": nn.name, "agent-2": nets[1].name},
		agents: map[string]*agentProc{"agent-1": a, "agent-2": a2}}
	t.Run("mesh", func(t *testing.T) { testMesh(t, mc) })
	if t.Failed() {
		return
	}

	// "evictable" tolerates a lost node for 1 s: it is replaced elsewhere
	// when agent-1 is lost. The server's node is cordoned until the
	// Deployment's pod runs on agent-1.
	if out, err := s.kubectl("cordon", "e2e-node"); err != nil {
		t.Fatalf("cordon: %v: %s", err, out)
	}
	evictable := nativeSpec("e2e.local/prog:v1", "forever")
	evictable.Containers[0].ImagePullPolicy = corev1.PullNever
	for _, key := range []string{corev1.TaintNodeUnreachable, corev1.TaintNodeNotReady} {
		evictable.Tolerations = append(evictable.Tolerations, corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists,
			Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](1)})
	}
	labels := map[string]string{"app": "evictable"}
	if _, err := c.AppsV1().Deployments("default").Create(ctx(t), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "evictable"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: evictable}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.AppsV1().Deployments("default").Delete(context.Background(), "evictable", metav1.DeleteOptions{})
	})
	podsOf := func(app string) []corev1.Pod {
		t.Helper()
		l, err := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	var evicted string
	waitFor(t, 2*time.Minute, "evictable Running on agent-1", func() error {
		ps := podsOf("evictable")
		if len(ps) != 1 || ps[0].Spec.NodeName != "agent-1" || running(&ps[0]) != nil {
			return fmt.Errorf("%d pods", len(ps))
		}
		evicted = ps[0].Name
		return nil
	})
	if out, err := s.kubectl("uncordon", "e2e-node"); err != nil {
		t.Fatalf("uncordon: %v: %s", err, out)
	}
	pod := nativePod("on-agent", "e2e.local/prog:v1", "echo:hello from agent-1", "forever")
	pod.Spec.NodeSelector["kubernetes.io/hostname"] = "agent-1"
	pod.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
	s.createPod(t, pod)
	p := waitPod(t, c, "on-agent", 2*time.Minute, running)
	if p.Spec.NodeName != "agent-1" {
		t.Fatalf("pod on %s", p.Spec.NodeName)
	}
	started := p.Status.ContainerStatuses[0].State.Running.StartedAt
	notRestarted := func(name string, started metav1.Time) func() error {
		return func() error {
			p, err := c.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if err := running(p); err != nil {
				return err
			}
			cs := p.Status.ContainerStatuses[0]
			if cs.RestartCount != 0 || cs.State.Running == nil || !cs.State.Running.StartedAt.Equal(&started) {
				return fmt.Errorf("container restarted: %+v", cs)
			}
			return nil
		}
	}
	nodeReady := func(want corev1.ConditionStatus) func() error {
		return func() error {
			n, err := c.CoreV1().Nodes().Get(ctx(t), "agent-1", metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == want {
					return nil
				}
			}
			return fmt.Errorf("Ready is not %s: %+v", want, n.Status.Conditions)
		}
	}

	// Logs and exec go apiserver → the agent's kubelet API over the veth.
	waitFor(t, 30*time.Second, "kubectl logs", func() error {
		out, err := s.kubectl("logs", "on-agent")
		if err != nil || !strings.Contains(out, "hello from agent-1") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if out, err := s.kubectl("exec", "on-agent", "--", "prog", "echo:exec on agent-1"); err != nil || !strings.Contains(out, "exec on agent-1") {
		t.Fatalf("kubectl exec: %v: %s", err, out)
	}

	testAgentLocalPath(t, s, c, agentDir)

	// An agent restart joins again and re-attaches to the running pod.
	a.stop()
	a.start()
	a.waitUp()
	if !strings.Contains(a.out.String(), "joined") {
		t.Errorf("the restarted agent did not join again:\n%s", a.out.String())
	}
	waitFor(t, time.Minute, "on-agent re-attached", notRestarted("on-agent", started))
	if out, err := s.kubectl("exec", "on-agent", "--", "prog", "echo:after restart"); err != nil || !strings.Contains(out, "after restart") {
		t.Fatalf("kubectl exec after the agent's restart: %v: %s", err, out)
	}
	// metrics.k8s.io covers the agent's node and pods: the server's node
	// scrapes agent-1's kubelet (two scrapes 15 s apart make a rate;
	// checked here, before the server's restart, by when they have been made).
	waitFor(t, 90*time.Second, "kubectl top for agent-1 and its pod", func() error {
		out, err := s.kubectl("top", "pod", "on-agent", "--no-headers")
		if err != nil || !strings.HasPrefix(out, "on-agent ") {
			return fmt.Errorf("top pod: %v %s", err, out)
		}
		out, err = s.kubectl("top", "node", "--no-headers")
		if err != nil || !strings.Contains(out, "agent-1 ") || !strings.Contains(out, "e2e-node ") {
			return fmt.Errorf("top node: %v %s", err, out)
		}
		return nil
	})

	// A server restart: the agent and its pods go on; nothing restarts.
	s.stop()
	s.start()
	c = s.client()
	waitFor(t, time.Minute, "agent-1 Ready after the server's restart", nodeReady(corev1.ConditionTrue))
	waitFor(t, 30*time.Second, "on-agent untouched by the server's restart", notRestarted("on-agent", started))

	// kill -9 of the agent (its children die with it; the pods do not):
	// the Node goes NotReady, "evictable" is replaced on the server's
	// node after its 1 s; on-agent (300 s) stays. The agent back: it
	// re-attaches to on-agent and ends the evicted pod.
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.done
	a.cmd = nil
	waitFor(t, time.Minute, "agent-1 NotReady", func() error {
		if nodeReady(corev1.ConditionTrue)() == nil {
			return fmt.Errorf("still Ready")
		}
		return nil
	})
	waitFor(t, time.Minute, "evictable replaced on e2e-node", func() error {
		for _, p := range podsOf("evictable") {
			if p.Name != evicted && p.Spec.NodeName == "e2e-node" && running(&p) == nil {
				return nil
			}
		}
		return fmt.Errorf("no replacement Running on e2e-node")
	})
	a.start()
	a.waitUp()
	waitFor(t, time.Minute, "agent-1 Ready again", nodeReady(corev1.ConditionTrue))
	waitFor(t, 30*time.Second, "on-agent re-attached after kill -9", notRestarted("on-agent", started))
	// The agent's new netd made the mesh device again: pods reach across.
	waitFor(t, time.Minute, "the mesh back after kill -9", func() error {
		pods := mc.spreadPods(t)
		from, to := pods["e2e-node"], pods["agent-1"]
		if from.Name == "" || to.Name == "" {
			return fmt.Errorf("spread pods on %d nodes", len(pods))
		}
		return mc.dialFrom(from, net.JoinHostPort(to.Status.PodIP, "8080"), to.Status.PodIP)
	})
	waitFor(t, time.Minute, "the evicted pod ended by agent-1", func() error {
		_, err := c.CoreV1().Pods("default").Get(ctx(t), evicted, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("pod %s still there (%v)", evicted, err)
	})

	// Everything ends through the API, on both nodes: a pod object is
	// gone once its node ended its processes.
	fg := metav1.DeletePropagationForeground
	if err := c.AppsV1().Deployments("default").Delete(ctx(t), "evictable", metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		t.Fatal(err)
	}
	s.deletePod(t, "on-agent", 0)
	waitFor(t, time.Minute, "evictable's pods gone", func() error {
		if ps := podsOf("evictable"); len(ps) > 0 {
			return fmt.Errorf("%d left", len(ps))
		}
		return nil
	})
}

// testAgentLocalPath: a claim of the default StorageClass whose pod runs on
// agent-1 gets its volume from agent-1's own local-path provisioner (its
// credential from the join), in agent-1's data dir; deleting the claim
// removes the volume and its directory there.
func testAgentLocalPath(t *testing.T, s *server, c kubernetes.Interface, agentDir string) {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "agent-data"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := c.CoreV1().PersistentVolumeClaims("default").Create(ctx(t), pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := nativePod("pvc-on-agent", "e2e.local/prog:v1", "append:/data/file:written on agent-1", "forever")
	pod.Spec.NodeSelector["kubernetes.io/hostname"] = "agent-1"
	pod.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "agent-data"}}}}
	s.createPod(t, pod)
	waitPod(t, c, "pvc-on-agent", 2*time.Minute, running)
	bound, err := c.CoreV1().PersistentVolumeClaims("default").Get(ctx(t), "agent-data", metav1.GetOptions{})
	if err != nil || bound.Status.Phase != corev1.ClaimBound {
		t.Fatalf("claim on agent-1: %v %v", bound.Status.Phase, err)
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx(t), bound.Spec.VolumeName, metav1.GetOptions{})
	if err != nil || pv.Spec.HostPath == nil || pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		t.Fatalf("volume %+v: %v", pv, err)
	}
	if terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms; len(terms) != 1 || len(terms[0].MatchExpressions) != 1 ||
		strings.Join(terms[0].MatchExpressions[0].Values, ",") != "agent-1" {
		t.Errorf("volume's node affinity %+v, want agent-1 only", terms)
	}
	dir := pv.Spec.HostPath.Path
	if !strings.HasPrefix(dir, filepath.Join(agentDir, "storage")+"/") {
		t.Fatalf("volume directory %s is not under agent-1's data dir's storage/", dir)
	}
	waitFor(t, 30*time.Second, "the pod's file in agent-1's volume", func() error {
		b, err := os.ReadFile(filepath.Join(dir, "file"))
		if err != nil || string(b) != "written on agent-1\n" {
			return fmt.Errorf("%v %q", err, b)
		}
		return nil
	})
	if err := c.CoreV1().Pods("default").Delete(ctx(t), "pvc-on-agent", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "pvc-on-agent gone", func() error {
		if _, err := c.CoreV1().Pods("default").Get(ctx(t), "pvc-on-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	if err := c.CoreV1().PersistentVolumeClaims("default").Delete(ctx(t), "agent-data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the volume and its directory on agent-1 removed with the claim", func() error {
		if _, err := c.CoreV1().PersistentVolumes().Get(ctx(t), pv.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("volume %s: %v", pv.Name, err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			return fmt.Errorf("directory %s: %v", dir, err)
		}
		return nil
	})
}
