// Package clustertest provides honest fakes of what klimax's cluster manager
// drives but cannot run here: a recording fake of kind and docker exec in the
// guest (which also serves as the Docker inventory of the clusters it
// "created"), a recording fake Kubernetes API per cluster, and a local server
// for the pinned upstream manifests. Shared by the cluster and cli tests.
package clustertest

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubeletoptions "k8s.io/kubernetes/cmd/kubelet/app/options"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/slot"

	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// Kind is a recording fake of the guest runner that behaves like kind
// and docker exec for the commands klimax issues, plus the Docker inventory
// view of the clusters it "created". It rejects any command it does not know,
// so an unexpected command fails the test.
type Kind struct {
	mu       sync.Mutex
	calls    []string          // argv joined by spaces
	Stdin    map[string]string // argv -> stdin
	Clusters map[string]cluster.NodeContainer
	// Workers are the worker node containers per cluster, in kind's naming
	// (<name>-worker, <name>-worker2, ...).
	Workers map[string][]cluster.NodeContainer
	Files   map[string]string // node:path -> content
	// Images are the images in the machine's Docker engine (what
	// `kind load docker-image` can load); Loaded records what was loaded
	// into each cluster.
	Images map[string]bool
	Loaded map[string][]string
	// LocalMachine: kind runs on this host, so `kind export logs <dir>`
	// writes real files there; otherwise the guest files are kept here.
	LocalMachine bool
	guestFiles   map[string]map[string]string // guest dir -> rel path -> content
	FailOn       string                       // argv prefix that fails
	// OnCreate, if set, sees each created cluster's kind config (as kind
	// would apply its node labels).
	OnCreate func(name string, port int, kindConfig []byte)
}

func NewKind() *Kind {
	return &Kind{Stdin: map[string]string{}, Clusters: map[string]cluster.NodeContainer{}, Workers: map[string][]cluster.NodeContainer{},
		Files: map[string]string{}, Images: map[string]bool{}, Loaded: map[string][]string{}, guestFiles: map[string]map[string]string{}}
}

// exitErr is how the guest runner reports a failed command.
func exitErr(argv []string, stderr string) (vm.Result, error) {
	return vm.Result{ExitCode: 1}, &vm.ExitError{Argv: argv, ExitCode: 1, Stderr: stderr}
}

// ExportedLogs are the files kind wrote for each node of a cluster (what
// the fake's `kind export logs` produces).
func ExportedLogs(name string) map[string]string {
	return map[string]string{
		"kind-version.txt":                       "kind v0.31.0 (fake)\n",
		name + "-control-plane/kubelet.log":      "kubelet log of " + name + "\n",
		name + "-control-plane/containerd.log":   "containerd log of " + name + "\n",
		name + "-control-plane/pods/kube-system": "",
	}
}

func (f *Kind) Run(ctx context.Context, argv []string, opts vm.RunOptions) (vm.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	line := strings.Join(argv, " ")
	f.calls = append(f.calls, line)
	var in string
	if opts.Stdin != nil {
		b, _ := io.ReadAll(opts.Stdin)
		in = string(b)
		f.Stdin[line] = in
	}
	if opts.Timeout <= 0 {
		return vm.Result{}, fmt.Errorf("command without a timeout: %s", line)
	}
	if f.FailOn != "" && strings.HasPrefix(line, f.FailOn) {
		return exitErr(argv, "injected failure")
	}
	name := flagValue(argv, "--name")
	switch {
	case strings.HasPrefix(line, "kind create cluster"):
		if _, ok := f.Clusters[name]; ok {
			return vm.Result{}, fmt.Errorf("node(s) already exist for a cluster with the name %q", name)
		}
		var kc cluster.KindCluster
		if err := yaml.Unmarshal([]byte(in), &kc); err != nil {
			return exitErr(argv, fmt.Sprintf("ERROR: failed to create cluster: unable to decode config: %v", err))
		}
		if err := KubeletAccepts(kc); err != nil {
			// kind starts the nodes, kubeadm init waits 4 minutes for a
			// kubelet that refused its --node-labels, and kind deletes the
			// nodes again: nothing is left.
			return exitErr(argv, "ERROR: failed to create cluster: failed to init node with kubeadm: kubelet: "+err.Error())
		}
		port := kc.Networking.APIServerPort
		// On a host (127.0.0.1) Docker publishes the port here and fails
		// when another program holds it, as the real engine does.
		if kc.Networking.APIServerAddress == "127.0.0.1" {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", fmt.Sprint(port)))
			if err != nil {
				return exitErr(argv, fmt.Sprintf("ERROR: failed to create cluster: command \"docker run --name %s ...\" failed with error: exit status 125\nCommand Output: docker: Error response from daemon: driver failed programming external connectivity on endpoint %s: Error starting userland proxy: %v.", cluster.NodeName(name), cluster.NodeName(name), err))
			}
			l.Close()
		}
		for _, c := range f.Clusters {
			if c.APIPort == port {
				return exitErr(argv, fmt.Sprintf("ERROR: failed to create cluster: docker run error: Bind for %s:%d failed: port is already allocated", kc.Networking.APIServerAddress, port))
			}
		}
		f.Clusters[name] = cluster.NodeContainer{Cluster: name, Container: cluster.NodeName(name), Role: "control-plane", State: "running", APIPort: port}
		var workers []cluster.NodeContainer
		for _, n := range kc.Nodes[1:] {
			if n.Role != "worker" {
				continue
			}
			c := name + "-worker"
			if len(workers) > 0 {
				c += fmt.Sprint(len(workers) + 1)
			}
			workers = append(workers, cluster.NodeContainer{Cluster: name, Container: c, Role: "worker", State: "running"})
		}
		if len(workers) > 0 {
			f.Workers[name] = workers
		}
		if f.OnCreate != nil {
			f.OnCreate(name, port, []byte(in))
		}
	case strings.HasPrefix(line, "kind delete cluster"):
		delete(f.Clusters, name)
		delete(f.Workers, name)
	case strings.HasPrefix(line, "kind get kubeconfig"):
		c, ok := f.Clusters[name]
		if !ok {
			return exitErr(argv, fmt.Sprintf("ERROR: could not locate any control plane nodes for cluster named '%s'. Use the --name option to select a different cluster", name))
		}
		if c.State != "running" {
			return exitErr(argv, fmt.Sprintf("ERROR: failed to get cluster internal kubeconfig: command \"docker exec --privileged %s cat /etc/kubernetes/admin.conf\" failed with error: exit status 1", c.Container))
		}
		return vm.Result{Stdout: []byte(Kubeconfig(name, c.APIPort))}, nil
	case strings.HasPrefix(line, "kind load docker-image"):
		// Messages and their order as kind v0.31.0: flags, images present
		// in the engine, then the cluster's nodes.
		if len(argv) < 5 || argv[3] != "--name" {
			return exitErr(argv, "fake kind: use kind load docker-image --name <name> <image>...")
		}
		images := argv[5:]
		for _, img := range images {
			if strings.HasPrefix(img, "-") {
				return exitErr(argv, "ERROR: unknown flag: "+img)
			}
		}
		if len(images) == 0 {
			return exitErr(argv, "ERROR: a list of image names is required")
		}
		for _, img := range images {
			if !f.Images[img] {
				return exitErr(argv, fmt.Sprintf("ERROR: image: %q not present locally", img))
			}
		}
		nodes := f.nodesLocked(name)
		if len(nodes) == 0 {
			return exitErr(argv, fmt.Sprintf("ERROR: no nodes found for cluster %q", name))
		}
		for _, n := range nodes {
			if n.State != "running" {
				return exitErr(argv, fmt.Sprintf("ERROR: failed to load image: command \"docker exec --privileged -i %s ctr --namespace=k8s.io images import --all-platforms --digests --snapshotter=overlayfs -\" failed with error: exit status 1", n.Container))
			}
		}
		f.Loaded[name] = append(f.Loaded[name], images...)
	case strings.HasPrefix(line, "kind export logs"):
		if len(argv) != 6 || argv[4] != "--name" {
			return exitErr(argv, "fake kind: use kind export logs <dir> --name <name>")
		}
		dir := argv[3]
		if len(f.nodesLocked(name)) == 0 {
			return exitErr(argv, fmt.Sprintf("ERROR: unknown cluster %q", name))
		}
		files := ExportedLogs(name)
		if f.LocalMachine {
			for rel, content := range files {
				p := filepath.Join(dir, rel)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					return exitErr(argv, err.Error())
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					return exitErr(argv, err.Error())
				}
			}
		} else {
			f.guestFiles[dir] = files
		}
		return vm.Result{Stdout: []byte("Exporting logs for cluster \"" + name + "\" to:\n" + dir + "\n")}, nil
	case len(argv) == 6 && argv[0] == "tar" && argv[1] == "-C" && argv[3] == "-cf" && argv[4] == "-" && argv[5] == ".":
		files, ok := f.guestFiles[argv[2]]
		if !ok || f.LocalMachine {
			return exitErr(argv, "tar: "+argv[2]+": Cannot open: No such file or directory")
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		keys := make([]string, 0, len(files))
		for k := range files {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			tw.WriteHeader(&tar.Header{Name: "./" + k, Mode: 0o644, Size: int64(len(files[k])), Typeflag: tar.TypeReg})
			tw.Write([]byte(files[k]))
		}
		tw.Close()
		return vm.Result{Stdout: buf.Bytes()}, nil
	case len(argv) == 4 && argv[0] == "rm" && argv[1] == "-rf" && argv[2] == "--" && strings.HasPrefix(argv[3], "/tmp/klimax-logs-"):
		delete(f.guestFiles, argv[3])
	case len(argv) > 3 && argv[0] == "docker" && argv[1] == "exec":
		node := argv[2]
		if node == "-i" {
			node = argv[3]
		}
		n, ok := f.containerLocked(node)
		if !ok {
			return exitErr(argv, "Error response from daemon: No such container: "+node)
		}
		if n.State != "running" {
			return exitErr(argv, "Error response from daemon: container "+node+" is not running")
		}
		if argv[len(argv)-2] == "/dev/stdin" {
			f.Files[node+":"+argv[len(argv)-1]] = in
		}
	default:
		return vm.Result{}, fmt.Errorf("fake kind: unexpected command %q", line)
	}
	return vm.Result{}, nil
}

// GuestLogDirs lists guest directories `kind export logs` wrote that were
// not removed.
func (f *Kind) GuestLogDirs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for d := range f.guestFiles {
		out = append(out, d)
	}
	return out
}

// nodesLocked lists a cluster's node containers, control plane first.
func (f *Kind) nodesLocked(name string) []cluster.NodeContainer {
	c, ok := f.Clusters[name]
	if !ok {
		return nil
	}
	return append([]cluster.NodeContainer{c}, f.Workers[name]...)
}

func (f *Kind) containerLocked(container string) (cluster.NodeContainer, bool) {
	for name := range f.Clusters {
		for _, n := range f.nodesLocked(name) {
			if n.Container == container {
				return n, true
			}
		}
	}
	return cluster.NodeContainer{}, false
}

func (f *Kind) setState(containers []string, state string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range containers {
		f.calls = append(f.calls, "docker-api "+map[string]string{"running": "start", "exited": "stop"}[state]+" "+c)
		found := false
		for name, cp := range f.Clusters {
			if cp.Container == c {
				cp.State = state
				f.Clusters[name] = cp
				found = true
			}
			for i, w := range f.Workers[name] {
				if w.Container == c {
					f.Workers[name][i].State = state
					found = true
				}
			}
		}
		if !found {
			return fmt.Errorf("Error response from daemon: No such container: %s", c)
		}
	}
	return nil
}

// Nodes, StopNodes and StartNodes are the Docker-level node operations.
func (f *Kind) Nodes(ctx context.Context, name string) ([]cluster.NodeContainer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodesLocked(name), nil
}

func (f *Kind) StopNodes(ctx context.Context, containers []string) error {
	return f.setState(containers, "exited")
}

func (f *Kind) StartNodes(ctx context.Context, containers []string) error {
	return f.setState(containers, "running")
}

// ImageExists reports whether the fake engine has an image.
func (f *Kind) ImageExists(ctx context.Context, ref string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Images[ref], nil
}

// KubeletAccepts checks every node of a kind config the way the nodes'
// kubelets will: kind passes node labels as --node-labels, and the kubelet's
// own flag validation (called here, not copied) refuses invalid labels and
// kubernetes.io / k8s.io keys outside its allowed set.
func KubeletAccepts(kc cluster.KindCluster) error {
	if len(kc.Nodes) == 0 {
		return fmt.Errorf("no nodes")
	}
	for i, n := range kc.Nodes {
		if n.Role != "control-plane" && n.Role != "worker" {
			return fmt.Errorf("nodes[%d]: unknown role %q", i, n.Role)
		}
		if kc.Nodes[0].Role != "control-plane" {
			return fmt.Errorf("nodes[0] must be a control-plane node")
		}
		if err := kubeletoptions.ValidateKubeletFlags(&kubeletoptions.KubeletFlags{NodeLabels: n.Labels}); err != nil {
			return fmt.Errorf("nodes[%d] (%s): %w", i, n.Role, err)
		}
	}
	return nil
}

func (f *Kind) ControlPlanes(ctx context.Context) ([]cluster.NodeContainer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []cluster.NodeContainer
	for _, c := range f.Clusters {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cluster < out[j].Cluster })
	return out, nil
}

func (f *Kind) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func flagValue(argv []string, flag string) string {
	for i := range argv[:len(argv)-1] {
		if argv[i] == flag {
			return argv[i+1]
		}
	}
	return ""
}

func Kubeconfig(name string, port int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kind-%[1]s
  cluster:
    certificate-authority-data: Q0E=
    server: https://0.0.0.0:%[2]d
users:
- name: kind-%[1]s
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
contexts:
- name: kind-%[1]s
  context:
    cluster: kind-%[1]s
    user: kind-%[1]s
current-context: kind-%[1]s
`, name, port)
}

// API records what klimax does to a cluster's API.
type API struct {
	mu       sync.Mutex
	Server   string
	Log      []string
	corefile string
	Labels   map[string]string
	LBIP     string
	// NotReady, when set, names what never gets ready (WaitReady blocks).
	NotReady string
}

type Kubes struct {
	mu    sync.Mutex
	ByURL map[string]*API
}

// NewKubes returns an empty set of fake clusters' APIs.
func NewKubes() *Kubes { return &Kubes{ByURL: map[string]*API{}} }

func (fk *Kubes) New(kc []byte) (cluster.Kube, error) {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	var server string
	for _, l := range strings.Split(string(kc), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "server: "); ok {
			server = v
		}
	}
	if k, ok := fk.ByURL[server]; ok {
		return k, nil
	}
	k := &API{Server: server, corefile: ".:53 {\n    forward . /etc/resolv.conf\n}\n", Labels: map[string]string{}}
	fk.ByURL[server] = k
	return k, nil
}

func (k *API) record(s string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.Log = append(k.Log, s)
}

func (k *API) Apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		k.record("apply " + o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName())
		if o.GetKind() == "IPAddressPool" {
			a, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "addresses")
			k.record("pool " + strings.Join(a, ","))
		}
	}
	return nil
}
func (k *API) Delete(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		k.record("delete " + o.GetKind() + " " + o.GetName())
	}
	return nil
}
func (k *API) WaitDeployment(ctx context.Context, ns, name string) error {
	k.record("wait " + ns + "/" + name)
	return nil
}
func (k *API) Corefile(ctx context.Context) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.corefile, nil
}
func (k *API) SetCorefile(ctx context.Context, cf string) error {
	k.record("set corefile")
	k.mu.Lock()
	defer k.mu.Unlock()
	k.corefile = cf
	return nil
}
func (k *API) NodeLabels(ctx context.Context) (map[string]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]string{}
	for a, b := range k.Labels {
		out[a] = b
	}
	return out, nil
}
func (k *API) LabelNode(ctx context.Context, set map[string]string, remove []string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for a, b := range set {
		k.Labels[a] = b
	}
	for _, a := range remove {
		delete(k.Labels, a)
	}
	return nil
}

// WaitReady blocks until ctx ends while NotReady is set, as a cluster that
// never gets ready would.
func (k *API) WaitReady(ctx context.Context) error {
	k.record("wait ready")
	k.mu.Lock()
	nr := k.NotReady
	k.mu.Unlock()
	if nr == "" {
		return nil
	}
	<-ctx.Done()
	return fmt.Errorf("not ready: %s (%v)", nr, ctx.Err())
}

func (k *API) LoadBalancerIP(ctx context.Context, ns, name string) (string, error) {
	if k.LBIP == "" {
		return "", fmt.Errorf("no LB in fake")
	}
	return k.LBIP, nil
}

// ManifestServer serves small stand-ins for the MetalLB and metrics-server
// manifests on 127.0.0.1 and counts downloads.
func ManifestServer() (*httptest.Server, *int) {
	n := new(int)
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*n++
		mu.Unlock()
		switch {
		case strings.Contains(r.URL.Path, "/metallb/v0.16.1/"):
			io.WriteString(w, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: metallb-system\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: controller\n  namespace: metallb-system\n")
		case strings.Contains(r.URL.Path, "/metrics-server/"):
			io.WriteString(w, "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: metrics-server\n  namespace: kube-system\nspec:\n  template:\n    spec:\n      containers:\n      - name: metrics-server\n        args: [--secure-port=10250]\n")
		default:
			http.NotFound(w, r)
		}
	}))
	return srv, n
}

// CorefileText returns the fake cluster's current Corefile.
func (k *API) CorefileText() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.corefile
}

// Env is a cluster.Manager wired to the fakes, with all files under a temp home.
type Env struct {
	M     *cluster.Manager
	Kind  *Kind
	Kubes *Kubes
	Home  string
	// Downloads counts manifest downloads from the local manifest server.
	Downloads *int
}

// NewEnv builds an Env; the manifest server is closed when the test ends.
func NewEnv(t testing.TB, cfg *config.Config) *Env {
	t.Helper()
	home := t.TempDir()
	srv, dl := ManifestServer()
	t.Cleanup(srv.Close)
	fk := NewKind()
	kubes := NewKubes()
	m := &cluster.Manager{
		Config:        cfg,
		Runner:        fk,
		Inventory:     fk,
		APIHost:       func(context.Context) (string, error) { return "192.168.64.3", nil },
		ListenAddress: "0.0.0.0",
		NewKube:       kubes.New,
		Manifests: &cluster.Manifests{Dir: filepath.Join(home, "cache"),
			MetalLBURL: srv.URL + "/metallb/%s/metallb-native.yaml", MetricsServerURL: srv.URL + "/metrics-server/%s/components.yaml"},
		KubeDir:     filepath.Join(home, ".kube", "klimax"),
		KubeConfig:  filepath.Join(home, ".kube", "config"),
		ImageExists: fk.ImageExists,
		Leases:      &slot.Leases{Dir: filepath.Join(home, ".klimax", "slots")},
	}
	// kind applies the config's node labels; mirror that in the fake API.
	fk.OnCreate = func(name string, port int, kindConfig []byte) {
		var kc cluster.KindCluster
		if err := yaml.Unmarshal(kindConfig, &kc); err != nil || len(kc.Nodes) == 0 {
			t.Errorf("kind config for %s does not parse: %v", name, err)
			return
		}
		api, _ := kubes.New([]byte(fmt.Sprintf("server: https://192.168.64.3:%d", port)))
		_ = api.LabelNode(context.Background(), kc.Nodes[0].Labels, nil)
	}
	return &Env{M: m, Kind: fk, Kubes: kubes, Home: home, Downloads: dl}
}
