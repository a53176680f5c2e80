package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/moby/moby/client"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker/dockertest"
	"github.com/k3sm-dev/k3sm/internal/klimax/guest"
	"github.com/k3sm-dev/k3sm/internal/klimax/nodeimage"
	"github.com/k3sm-dev/k3sm/internal/klimax/slot"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// TestIntegrationNodeImageFleet runs real kind clusters from the offline
// node image (`make node-image` builds it) with the host driver: up, a fleet
// of two clusters (one depending on the other), their slots, labels and
// subnets, MetalLB handing out an address of the slot's pool, CoreDNS
// forwarding a configured domain to a resolver the test runs on the kind
// network, a pod whose image is pulled through a registry mirror, the merged
// kubeconfig; then fleet delete and destroy leave nothing behind. Every
// image is built here; traffic goes to 127.0.0.1 (published API and
// registry ports) or stays inside the test's Docker network.
func TestIntegrationNodeImageFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: creates two kind clusters")
	}
	dc := dockertest.Engine(t)
	kindWant := guest.DefaultKind.Version
	if out, err := exec.Command("kind", "version").Output(); err != nil {
		t.Skipf("kind is not in PATH (%v): make node-image installs kind %s", err, kindWant)
	} else if f := strings.Fields(string(out)); len(f) < 2 || f[1] != kindWant {
		t.Skipf("kind is %q, the node image needs the pinned %s (older kinds write kubeadm configs kubeadm 1.37 refuses): make node-image installs it", strings.TrimSpace(string(out)), kindWant)
	}
	version := kubernetesVersion(t)
	nodeImage := cluster.LocalNodeRepository + ":" + version
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	if ok, err := dc.ImageExists(ctx, nodeImage); err != nil || !ok {
		t.Skipf("no node image %s in the Docker engine (%v): run `make node-image` (klimax node-image build)", nodeImage, err)
	}
	if ok, _ := dc.ImageExists(ctx, "docker.io/library/registry:3.0.0"); !ok {
		t.Skip("no registry:3.0.0 image (klimax node-image build loads it): run `make node-image`")
	}
	if n, _ := dc.InspectNetwork(ctx, "kind"); n != nil {
		t.Skipf("a Docker network named kind exists (%s): another kind or klimax uses this engine; not disturbing it", n.ID)
	}
	start := time.Now()

	home := t.TempDir()
	cidr := dockertest.FreeBridgeCIDRLow(t, dc) // not the one a parallel platform test takes
	prefix := strings.Join(strings.Split(cidr.Addr().String(), ".")[:2], ".")
	resolverIP := prefix + ".0.53"
	tag := strings.ToLower(dockertest.UniqueName("it"))
	upstream := "klimax-it-upstream-" + tag
	mirror := "klimax-it-mirror-" + tag
	mirrorPort := dockertest.FreePort(t)
	upstreamPort := dockertest.FreePort(t)
	for upstreamPort == mirrorPort {
		upstreamPort = dockertest.FreePort(t)
	}
	resolver := "klimax-it-dns-" + tag
	fleetName := "it" + tag[len(tag)-6:]
	a, b := "ita", "itb"
	cfg := fmt.Sprintf(`vm:
  driver: host
network:
  kindBridgeCIDR: %s
kind:
  nodeVersion: %s
  customDnsResolvers:
  - domain: klimax-it.test
    resolvers: [%s]
registries:
  mirrors:
  - name: %s
    port: %d
    remoteURL: http://%s:5000
`, cidr, version, resolverIP, mirror, mirrorPort, upstream)
	cfgPath := filepath.Join(home, ".klimax", "config.yaml")
	os.MkdirAll(filepath.Dir(cfgPath), 0o755)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// the MetalLB manifest, offline: from the module MetalLB is built from
	// (klimax node-image build seeds ~/.klimax the same way)
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", "go.universe.tf/metallb@"+nodeimage.MetalLBVersion).Output()
	if err != nil {
		t.Fatalf("go mod download MetalLB: %v", err)
	}
	var mod struct{ Dir string }
	json.Unmarshal(out, &mod)
	mdata, err := os.ReadFile(filepath.Join(mod.Dir, "config", "manifests", "metallb-native.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&cluster.Manifests{Dir: filepath.Join(home, ".klimax", "cache", "manifests")}).Seed(nodeimage.MetalLBVersion, mdata); err != nil {
		t.Fatal(err)
	}
	klimax := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		app := &App{Streams: Streams{In: strings.NewReader(""), Out: &out, Err: &errb}, Home: home}
		root := NewRoot(app)
		root.SetArgs(args)
		s := time.Now()
		err := root.ExecuteContext(ctx)
		t.Logf("klimax %s (%s):\n%s%s", strings.Join(args, " "), time.Since(s).Round(time.Second), errb.String(), out.String())
		if err != nil {
			t.Fatalf("klimax %s: %v", strings.Join(args, " "), err)
		}
		return out.String()
	}
	docker := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			bg := context.Background()
			for _, c := range []string{a, b} {
				exec.Command("kind", "delete", "cluster", "--name", c, "--kubeconfig", filepath.Join(home, "kind.kubeconfig")).Run()
			}
			for _, n := range []string{upstream, mirror, resolver} {
				dc.API().ContainerRemove(bg, n, client.ContainerRemoveOptions{Force: true})
			}
			dc.API().NetworkRemove(bg, "kind", client.NetworkRemoveOptions{})
		}
	})

	// --- the test's own image: itprobe (HTTP server, DNS server, probes) ---
	probeImage := "klimax-it-probe:" + tag
	probe := buildProbe(t, ctx)
	img := probeImg(t, probe)
	loadImage(t, ctx, probeImage, img)
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", probeImage).Run() })

	// --- up: network and mirror -------------------------------------------
	klimax("up")
	if n, err := dc.InspectNetwork(ctx, "kind"); err != nil || n == nil || n.Subnets[0] != cidr {
		t.Fatalf("network kind after up: %+v %v", n, err)
	}
	// upstream registry (our registry build, not proxying) and the resolver,
	// both on the kind network
	docker("run", "-d", "--name", upstream, "--network", "kind", "-p", fmt.Sprintf("127.0.0.1:%d:5000", upstreamPort), "docker.io/library/registry:3.0.0")
	docker("run", "-d", "--name", resolver, "--network", "kind", "--ip", resolverIP, probeImage, "dns", ":53", "klimax-it.test", "10.99.88.77")
	ref, _ := name.ParseReference(fmt.Sprintf("127.0.0.1:%d/it/probe:v1", upstreamPort), name.Insecure)
	poll.Every(t, ctx, 30*time.Second, time.Second, "a push to the upstream registry", func() error {
		return remote.Write(ref, img, remote.WithContext(ctx))
	})

	// --- a fleet: itb depends on ita ----------------------------------------
	manifest := filepath.Join(home, "fleet.yaml")
	os.WriteFile(manifest, []byte(fmt.Sprintf(`apiVersion: klimax.dev/v1alpha1
kind: Fleet
metadata:
  name: %s
spec:
  clusters:
  - name: %s
  - name: %s
    dependsOn: [%s]
`, fleetName, a, b, a)), 0o644)
	s := time.Now()
	klimax("fleet", "create", "-f", manifest)
	t.Logf("fleet of two clusters created in %s", time.Since(s).Round(time.Second))

	kubeDir := filepath.Join(home, ".kube", "klimax")
	clients := map[string]kubernetes.Interface{}
	for i, c := range []string{a, b} {
		sl := slot.Slot(i + 1)
		cs := kubeClient(t, filepath.Join(kubeDir, c+".kubeconfig"), "")
		clients[c] = cs
		cfg, _ := clientcmd.LoadFromFile(filepath.Join(kubeDir, c+".kubeconfig"))
		for _, cl := range cfg.Clusters {
			if want := fmt.Sprintf("https://127.0.0.1:%d", sl.APIPort()); cl.Server != want {
				t.Errorf("%s kubeconfig server %s, want %s", c, cl.Server, want)
			}
		}
		node := waitNodeReady(t, ctx, cs, c+"-control-plane")
		want := map[string]string{cluster.LabelManagedBy: cluster.ManagedByValue, cluster.LabelSlot: fmt.Sprint(int(sl)), cluster.LabelFleet: fleetName}
		if c == b {
			want[cluster.DepLabelPrefix+a] = "true"
		}
		for k, v := range want {
			if node.Labels[k] != v {
				t.Errorf("%s node label %s=%q, want %q (labels %v)", c, k, node.Labels[k], v, node.Labels)
			}
		}
		if p, err := netip.ParsePrefix(node.Spec.PodCIDR); err != nil || !sl.PodSubnet().Contains(p.Addr()) {
			t.Errorf("%s podCIDR %q not in the slot's pod subnet %s", c, node.Spec.PodCIDR, sl.PodSubnet())
		}
		svc, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err != nil || !sl.ServiceSubnet().Contains(ip) {
			t.Errorf("%s kubernetes service %s not in the slot's service subnet %s", c, svc.Spec.ClusterIP, sl.ServiceSubnet())
		}
	}

	// --- merged kubeconfig: both contexts work -------------------------------
	shared := filepath.Join(home, ".kube", "config")
	for _, c := range []string{a, b} {
		cs := kubeClient(t, shared, cluster.ContextName(c))
		if _, err := cs.CoreV1().Nodes().Get(ctx, c+"-control-plane", metav1.GetOptions{}); err != nil {
			t.Errorf("context %s of %s: %v", cluster.ContextName(c), shared, err)
		}
	}

	// --- in ita: a pod from the mirrored registry behind a LoadBalancer -----
	cs := clients[a]
	image := fmt.Sprintf("%s:5000/it/probe:v1", upstream)
	mkPod(t, ctx, cs, "web", map[string]string{"app": "web"}, image, "serve", ":8080", "hello from "+a)
	_, err = cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPodRunning(t, ctx, cs, "web")
	blobs, _ := filepath.Glob(filepath.Join(home, ".klimax", "registry-cache", mirror, "docker", "registry", "v2", "blobs", "*", "*", "*"))
	if len(blobs) == 0 {
		t.Errorf("the pod's image %s did not go through the mirror: its cache under %s is empty", image, filepath.Join(home, ".klimax", "registry-cache", mirror))
	} else {
		t.Logf("mirror cache holds %d entries after the pull", len(blobs))
	}
	lbIP := waitLBAddress(t, ctx, cs, "web")
	pool := slot.Slot(1).MetalLBRanges(prefix)
	t.Logf("LoadBalancer address %s (pools %v)", lbIP, pool)
	if !inRanges(lbIP, pool) {
		t.Errorf("LoadBalancer address %s is outside slot 1's pools %v", lbIP, pool)
	}
	if got := docker("run", "--rm", "--network", "kind", probeImage, "get", "http://"+lbIP+"/"); !strings.Contains(got, "hello from "+a) {
		t.Errorf("GET http://%s/ from the kind network: %q", lbIP, got)
	}

	// --- in itb: CoreDNS forwards klimax-it.test to our resolver ------------
	cs = clients[b]
	mkPod(t, ctx, cs, "lookup", nil, image, "lookup", "host.klimax-it.test")
	if out := waitPodLogs(t, ctx, cs, "lookup"); !strings.Contains(out, "10.99.88.77") {
		t.Errorf("host.klimax-it.test resolved in a pod to %q, want 10.99.88.77 (CoreDNS forward to %s)", out, resolverIP)
	}

	// --- delete the fleet (dependents first), destroy ------------------------
	klimax("fleet", "delete", fleetName, "--yes")
	for _, n := range []string{upstream, resolver} { // the test's own containers
		dc.API().ContainerRemove(ctx, n, client.ContainerRemoveOptions{Force: true})
	}
	klimax("destroy", "--yes")
	destroyed = true
	if out := docker("ps", "-a", "--filter", "label=io.x-k8s.kind.cluster", "--format", "{{.Names}}"); strings.Contains(out, a+"-control-plane") || strings.Contains(out, b+"-control-plane") {
		t.Errorf("kind nodes survive: %s", out)
	}
	if _, err := dc.API().ContainerInspect(ctx, mirror, client.ContainerInspectOptions{}); err == nil {
		t.Errorf("mirror %s survives destroy", mirror)
	}
	if n, _ := dc.InspectNetwork(ctx, "kind"); n != nil {
		t.Errorf("network kind survives destroy")
	}
	if data, err := os.ReadFile(shared); err == nil && (bytes.Contains(data, []byte(cluster.ContextName(a))) || bytes.Contains(data, []byte(cluster.ContextName(b)))) {
		t.Errorf("%s still names the clusters:\n%s", shared, data)
	}
	t.Logf("whole test: %s", time.Since(start).Round(time.Second))
}

func kubernetesVersion(t *testing.T) string {
	data, err := os.ReadFile("../../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod does not require k8s.io/kubernetes")
	}
	return string(m[1])
}

func buildProbe(t *testing.T, ctx context.Context) string {
	out := filepath.Join(t.TempDir(), "itprobe")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./testdata/itprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build itprobe: %v\n%s", err, b)
	}
	return out
}

func probeImg(t *testing.T, bin string) v1.Image {
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	writeTar(t, &buf, "itprobe", data)
	layer, err := tarball.LayerFromReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goarch()
	cf.Config.Entrypoint = []string{"/itprobe"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func loadImage(t *testing.T, ctx context.Context, ref string, img v1.Image) {
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "docker", "load")
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker load: %v\n%s", err, out)
	}
}

func kubeClient(t *testing.T, path, context string) kubernetes.Interface {
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: path}
	cc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", path, err)
	}
	cc.Timeout = 20 * time.Second
	cs, err := kubernetes.NewForConfig(cc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func waitNodeReady(t *testing.T, ctx context.Context, cs kubernetes.Interface, node string) *corev1.Node {
	var n *corev1.Node
	poll.Every(t, ctx, 4*time.Minute, 2*time.Second, "node "+node+" Ready", func() error {
		got, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				n = got
				return nil
			}
		}
		return fmt.Errorf("%v", got.Status.Conditions)
	})
	return n
}

func mkPod(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string, labels map[string]string, image string, args ...string) {
	_, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: name, Image: image, Args: args, ImagePullPolicy: corev1.PullIfNotPresent,
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func podStatus(p *corev1.Pod) string {
	s := string(p.Status.Phase)
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Waiting != nil {
			s += " " + c.State.Waiting.Reason + ": " + c.State.Waiting.Message
		}
	}
	return s
}

func waitPodRunning(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string) {
	poll.Every(t, ctx, 3*time.Minute, 2*time.Second, "pod "+name+" running", func() error {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return errors.New(podStatus(p))
		}
		return nil
	})
}

func waitPodLogs(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string) string {
	poll.Every(t, ctx, 3*time.Minute, 2*time.Second, "pod "+name+" finished", func() error {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return errors.New(podStatus(p))
		}
		return nil
	})
	out, err := cs.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func waitLBAddress(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string) string {
	ip := ""
	poll.Every(t, ctx, 3*time.Minute, 2*time.Second, "LoadBalancer address of "+name, func() error {
		s, err := cs.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				ip = in.IP
				return nil
			}
		}
		return errors.New("no ingress yet")
	})
	return ip
}

// inRanges reports whether ip is in one of "a-b" ranges.
func inRanges(ip string, ranges []string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	for _, r := range ranges {
		lo, hi, ok := strings.Cut(r, "-")
		if !ok {
			continue
		}
		l, err1 := netip.ParseAddr(lo)
		h, err2 := netip.ParseAddr(hi)
		if err1 == nil && err2 == nil && a.Compare(l) >= 0 && a.Compare(h) <= 0 {
			return true
		}
	}
	return false
}

func writeTar(t *testing.T, w io.Writer, name string, data []byte) {
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func goarch() string { return runtime.GOARCH }
