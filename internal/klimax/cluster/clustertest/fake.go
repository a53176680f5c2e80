// Package clustertest provides honest fakes of what klimax's cluster manager
// drives but cannot run here: a recording fake of kind and docker exec in the
// guest (which also serves as the Docker inventory of the clusters it
// "created"), a recording fake Kubernetes API per cluster, and a local server
// for the pinned upstream manifests. Shared by the cluster and cli tests.
package clustertest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
	Files    map[string]string // node:path -> content
	FailOn   string            // argv prefix that fails
	// OnCreate, if set, sees each created cluster's kind config (as kind
	// would apply its node labels).
	OnCreate func(name string, port int, kindConfig []byte)
}

func NewKind() *Kind {
	return &Kind{Stdin: map[string]string{}, Clusters: map[string]cluster.NodeContainer{}, Files: map[string]string{}}
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
		return vm.Result{ExitCode: 1}, &vm.ExitError{Argv: argv, ExitCode: 1, Stderr: "injected failure"}
	}
	name := flagValue(argv, "--name")
	switch {
	case strings.HasPrefix(line, "kind create cluster"):
		if _, ok := f.Clusters[name]; ok {
			return vm.Result{}, fmt.Errorf("node(s) already exist for a cluster with the name %q", name)
		}
		var kc cluster.KindCluster
		if err := yaml.Unmarshal([]byte(in), &kc); err != nil {
			return vm.Result{}, fmt.Errorf("ERROR: failed to create cluster: unable to decode config: %v", err)
		}
		if err := KubeletAccepts(kc); err != nil {
			// kind starts the nodes, kubeadm init waits 4 minutes for a
			// kubelet that refused its --node-labels, and kind deletes the
			// nodes again: nothing is left.
			return vm.Result{ExitCode: 1}, &vm.ExitError{Argv: argv, ExitCode: 1,
				Stderr: "ERROR: failed to create cluster: failed to init node with kubeadm: kubelet: " + err.Error()}
		}
		port := kc.Networking.APIServerPort
		for _, c := range f.Clusters {
			if c.APIPort == port {
				return vm.Result{}, fmt.Errorf("port %d is already allocated", port)
			}
		}
		f.Clusters[name] = cluster.NodeContainer{Cluster: name, Container: cluster.NodeName(name), State: "running", APIPort: port}
		if f.OnCreate != nil {
			f.OnCreate(name, port, []byte(in))
		}
	case strings.HasPrefix(line, "kind delete cluster"):
		delete(f.Clusters, name)
	case strings.HasPrefix(line, "kind get kubeconfig"):
		c, ok := f.Clusters[name]
		if !ok {
			return vm.Result{}, fmt.Errorf("could not locate any control plane nodes for cluster named %q", name)
		}
		return vm.Result{Stdout: []byte(Kubeconfig(name, c.APIPort))}, nil
	case len(argv) > 3 && argv[0] == "docker" && argv[1] == "exec":
		node := argv[2]
		if node == "-i" {
			node = argv[3]
		}
		if !f.nodeExists(node) {
			return vm.Result{}, fmt.Errorf("No such container: %s", node)
		}
		if argv[len(argv)-2] == "/dev/stdin" {
			f.Files[node+":"+argv[len(argv)-1]] = in
		}
	default:
		return vm.Result{}, fmt.Errorf("fake kind: unexpected command %q", line)
	}
	return vm.Result{}, nil
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

func (f *Kind) nodeExists(node string) bool {
	for _, c := range f.Clusters {
		if c.Container == node {
			return true
		}
	}
	return false
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
		KubeDir:    filepath.Join(home, ".kube", "klimax"),
		KubeConfig: filepath.Join(home, ".kube", "config"),
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
