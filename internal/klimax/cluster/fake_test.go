package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// fakeKind is a recording fake of the guest runner that behaves like kind
// and docker exec for the commands klimax issues, plus the Docker inventory
// view of the clusters it "created". It rejects any command it does not know,
// so an unexpected command fails the test.
type fakeKind struct {
	mu       sync.Mutex
	calls    []string          // argv joined by spaces
	stdin    map[string]string // argv -> stdin
	clusters map[string]NodeContainer
	files    map[string]string // node:path -> content
	failOn   string            // argv prefix that fails
}

func newFakeKind() *fakeKind {
	return &fakeKind{stdin: map[string]string{}, clusters: map[string]NodeContainer{}, files: map[string]string{}}
}

func (f *fakeKind) Run(ctx context.Context, argv []string, opts vm.RunOptions) (vm.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	line := strings.Join(argv, " ")
	f.calls = append(f.calls, line)
	var in string
	if opts.Stdin != nil {
		b, _ := io.ReadAll(opts.Stdin)
		in = string(b)
		f.stdin[line] = in
	}
	if opts.Timeout <= 0 {
		return vm.Result{}, fmt.Errorf("command without a timeout: %s", line)
	}
	if f.failOn != "" && strings.HasPrefix(line, f.failOn) {
		return vm.Result{ExitCode: 1}, &vm.ExitError{Argv: argv, ExitCode: 1, Stderr: "injected failure"}
	}
	name := flagValue(argv, "--name")
	switch {
	case strings.HasPrefix(line, "kind create cluster"):
		if _, ok := f.clusters[name]; ok {
			return vm.Result{}, fmt.Errorf("node(s) already exist for a cluster with the name %q", name)
		}
		port := 0
		for _, l := range strings.Split(in, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "apiServerPort: "); ok {
				fmt.Sscan(v, &port)
			}
		}
		for _, c := range f.clusters {
			if c.APIPort == port {
				return vm.Result{}, fmt.Errorf("port %d is already allocated", port)
			}
		}
		f.clusters[name] = NodeContainer{Cluster: name, Container: NodeName(name), State: "running", APIPort: port}
	case strings.HasPrefix(line, "kind delete cluster"):
		delete(f.clusters, name)
	case strings.HasPrefix(line, "kind get kubeconfig"):
		c, ok := f.clusters[name]
		if !ok {
			return vm.Result{}, fmt.Errorf("could not locate any control plane nodes for cluster named %q", name)
		}
		return vm.Result{Stdout: []byte(fakeKubeconfig(name, c.APIPort))}, nil
	case len(argv) > 3 && argv[0] == "docker" && argv[1] == "exec":
		node := argv[2]
		if node == "-i" {
			node = argv[3]
		}
		if !f.nodeExists(node) {
			return vm.Result{}, fmt.Errorf("No such container: %s", node)
		}
		if argv[len(argv)-2] == "/dev/stdin" {
			f.files[node+":"+argv[len(argv)-1]] = in
		}
	default:
		return vm.Result{}, fmt.Errorf("fake kind: unexpected command %q", line)
	}
	return vm.Result{}, nil
}

func (f *fakeKind) nodeExists(node string) bool {
	for _, c := range f.clusters {
		if c.Container == node {
			return true
		}
	}
	return false
}

func (f *fakeKind) ControlPlanes(ctx context.Context) ([]NodeContainer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []NodeContainer
	for _, c := range f.clusters {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cluster < out[j].Cluster })
	return out, nil
}

func (f *fakeKind) Calls() []string {
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

func fakeKubeconfig(name string, port int) string {
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

// fakeKube records what klimax does to a cluster's API.
type fakeKube struct {
	mu       sync.Mutex
	server   string
	log      []string
	corefile string
	labels   map[string]string
	lbIP     string
}

type fakeKubes struct {
	mu    sync.Mutex
	byURL map[string]*fakeKube
}

func (fk *fakeKubes) New(kc []byte) (Kube, error) {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	var server string
	for _, l := range strings.Split(string(kc), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "server: "); ok {
			server = v
		}
	}
	if k, ok := fk.byURL[server]; ok {
		return k, nil
	}
	k := &fakeKube{server: server, corefile: ".:53 {\n    forward . /etc/resolv.conf\n}\n", labels: map[string]string{}}
	fk.byURL[server] = k
	return k, nil
}

func (k *fakeKube) record(s string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.log = append(k.log, s)
}

func (k *fakeKube) Apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		k.record("apply " + o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName())
		if o.GetKind() == "IPAddressPool" {
			a, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "addresses")
			k.record("pool " + strings.Join(a, ","))
		}
	}
	return nil
}
func (k *fakeKube) Delete(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		k.record("delete " + o.GetKind() + " " + o.GetName())
	}
	return nil
}
func (k *fakeKube) WaitDeployment(ctx context.Context, ns, name string) error {
	k.record("wait " + ns + "/" + name)
	return nil
}
func (k *fakeKube) Corefile(ctx context.Context) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.corefile, nil
}
func (k *fakeKube) SetCorefile(ctx context.Context, cf string) error {
	k.record("set corefile")
	k.mu.Lock()
	defer k.mu.Unlock()
	k.corefile = cf
	return nil
}
func (k *fakeKube) NodeLabels(ctx context.Context) (map[string]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]string{}
	for a, b := range k.labels {
		out[a] = b
	}
	return out, nil
}
func (k *fakeKube) LabelNode(ctx context.Context, set map[string]string, remove []string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for a, b := range set {
		k.labels[a] = b
	}
	for _, a := range remove {
		delete(k.labels, a)
	}
	return nil
}
func (k *fakeKube) LoadBalancerIP(ctx context.Context, ns, name string) (string, error) {
	if k.lbIP == "" {
		return "", fmt.Errorf("no LB in fake")
	}
	return k.lbIP, nil
}

// manifestServer serves small stand-ins for the MetalLB and metrics-server
// manifests on 127.0.0.1 and counts downloads.
func manifestServer() (*httptest.Server, *int) {
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

func TestE2ENginxFlow(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	info, err := e.m.Create(ctx, CreateOptions{Name: "dev", Mirrors: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	k := e.kubes.byURL[info.Server]
	k.lbIP = "172.30.1.16"
	var got []string
	ip, err := e.m.E2ENginx(ctx, "dev", true, func(ctx context.Context, url string) (int, string, error) {
		got = append(got, url)
		return 200, "<title>Welcome to nginx!</title>", nil
	})
	if err != nil || ip != "172.30.1.16" || len(got) != 1 || got[0] != "http://172.30.1.16/" {
		t.Fatalf("ip %q err %v gets %v", ip, err, got)
	}
	tail := k.log[len(k.log)-7:]
	want := []string{"apply Namespace /klimax-e2e", "apply Deployment klimax-e2e/nginx", "apply Service klimax-e2e/nginx",
		"wait klimax-e2e/nginx", "delete Service nginx", "delete Deployment nginx", "delete Namespace klimax-e2e"}
	if strings.Join(tail, "|") != strings.Join(want, "|") {
		t.Errorf("api calls %q", tail)
	}
}
