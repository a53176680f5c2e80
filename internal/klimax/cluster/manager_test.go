package cluster

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
)

type env struct {
	m     *Manager
	kind  *fakeKind
	kubes *fakeKubes
	home  string
	dl    *int
}

func newEnv(t *testing.T) *env {
	t.Helper()
	home := t.TempDir()
	cfg := config.Default()
	cfg.Kind.CustomDNSResolvers = []config.DNSResolver{{Domain: "runlocal.dev", Resolvers: []string{"8.8.8.8", "8.8.4.4"}}}
	srv, dl := manifestServer()
	t.Cleanup(srv.Close)
	fk := newFakeKind()
	kubes := &fakeKubes{byURL: map[string]*fakeKube{}}
	m := &Manager{
		Config:        cfg,
		Runner:        fk,
		Inventory:     fk,
		APIHost:       func(context.Context) (string, error) { return "192.168.64.3", nil },
		ListenAddress: "0.0.0.0",
		NewKube:       kubes.New,
		Manifests: &Manifests{Dir: filepath.Join(home, "cache"),
			MetalLBURL: srv.URL + "/metallb/%s/metallb-native.yaml", MetricsServerURL: srv.URL + "/metrics-server/%s/components.yaml"},
		KubeDir:    filepath.Join(home, ".kube", "klimax"),
		KubeConfig: filepath.Join(home, ".kube", "config"),
	}
	return &env{m: m, kind: fk, kubes: kubes, home: home, dl: dl}
}

func TestCreateExactCommandSequence(t *testing.T) {
	e := newEnv(t)
	os.MkdirAll(filepath.Dir(e.m.KubeConfig), 0o700)
	os.WriteFile(e.m.KubeConfig, []byte("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\ncurrent-context: \"\"\nmine: keep\n"), 0o600)
	info, err := e.m.Create(context.Background(), CreateOptions{Name: "dev", Region: "eu", Zone: "eu-1", Labels: map[string]string{"team": "a"},
		Mirrors: []string{"registry-dockerio", "registry-quayio"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kind create cluster --name dev --config -",
		"docker exec dev-control-plane mkdir -p /etc/containerd/certs.d/docker.io",
		"docker exec -i dev-control-plane cp /dev/stdin /etc/containerd/certs.d/docker.io/hosts.toml",
		"docker exec dev-control-plane mkdir -p /etc/containerd/certs.d/quay.io",
		"docker exec -i dev-control-plane cp /dev/stdin /etc/containerd/certs.d/quay.io/hosts.toml",
		"kind get kubeconfig --name dev",
	}
	if got := e.kind.Calls(); !reflect.DeepEqual(got, want) {
		t.Errorf("guest commands:\n got %q\nwant %q", got, want)
	}
	// kind got exactly the golden-tested config for this spec.
	kc, _ := KindConfig(Spec{Name: "dev", Slot: 1, NodeVersion: "v1.35.0", Region: "eu", Zone: "eu-1", Labels: map[string]string{"team": "a"}, ListenAddress: "0.0.0.0", APIHost: "192.168.64.3"})
	wantCfg, _ := kc.Render()
	if got := e.kind.stdin["kind create cluster --name dev --config -"]; got != string(wantCfg) {
		t.Errorf("kind config on stdin:\n%s", got)
	}
	if got := e.kind.files["dev-control-plane:/etc/containerd/certs.d/docker.io/hosts.toml"]; got != string(HostsTOML(config.DefaultMirrors()[0]).Content) {
		t.Errorf("hosts.toml written: %q", got)
	}
	kube := e.kubes.byURL["https://192.168.64.3:7001"]
	if kube == nil {
		t.Fatalf("no client for the rewritten server; have %v", e.kubes.byURL)
	}
	wantKube := []string{
		"apply Namespace /metallb-system", "apply Deployment metallb-system/controller",
		"wait metallb-system/controller",
		"apply IPAddressPool metallb-system/klimax", "pool 172.30.1.1-172.30.1.7,172.30.1.16-172.30.1.254",
		"apply L2Advertisement metallb-system/klimax",
		"set corefile",
	}
	if !reflect.DeepEqual(kube.log, wantKube) {
		t.Errorf("API calls:\n got %q\nwant %q", kube.log, wantKube)
	}
	if !strings.Contains(kube.corefile, "runlocal.dev:53 {") || !strings.Contains(kube.corefile, "forward . /etc/resolv.conf") {
		t.Errorf("corefile:\n%s", kube.corefile)
	}
	// Per-cluster kubeconfig: 0600, server rewritten; merged with the user's keys kept.
	st, err := os.Stat(e.m.KubeconfigPath("dev"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig file: %v %v", err, st)
	}
	data, _ := os.ReadFile(e.m.KubeconfigPath("dev"))
	if s, _ := kubeconfig.Server(data, ""); s != "https://192.168.64.3:7001" {
		t.Errorf("server %q", s)
	}
	merged, _ := os.ReadFile(e.m.KubeConfig)
	if !bytes.Contains(merged, []byte("name: kind-dev")) || !bytes.Contains(merged, []byte("mine: keep")) {
		t.Errorf("merged kubeconfig:\n%s", merged)
	}
	if info.Slot != 1 || info.APIPort != 7001 || info.Labels[LabelRegion] != "eu" {
		t.Errorf("info %+v", info)
	}
}

func TestCreateSlotsAndDuplicates(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, n := range []string{"a", "b", "c"} {
		if _, err := e.m.Create(ctx, CreateOptions{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	if *e.dl != 1 {
		t.Errorf("MetalLB manifest downloaded %d times, want once (cached)", *e.dl)
	}
	if err := e.m.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	info, err := e.m.Create(ctx, CreateOptions{Name: "d"})
	if err != nil || info.Slot != 2 {
		t.Errorf("d got slot %v (%v), want lowest free 2", info, err)
	}
	if _, err := e.m.Create(ctx, CreateOptions{Name: "e", Slot: 3}); err == nil || !strings.Contains(err.Error(), "slot 3 is already in use") {
		t.Errorf("pinned used slot: %v", err)
	}
	info, err = e.m.Create(ctx, CreateOptions{Name: "f", Slot: 42})
	if err != nil || info.APIPort != 7042 {
		t.Errorf("pinned 42: %+v %v", info, err)
	}
	if _, err := e.m.Create(ctx, CreateOptions{Name: "a"}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("duplicate: %v", err)
	}
	calls := len(e.kind.Calls())
	for _, bad := range []string{"Bad", "a;reboot", "$(id)", ""} {
		if _, err := e.m.Create(ctx, CreateOptions{Name: bad}); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
	if _, err := e.m.Create(ctx, CreateOptions{Name: "g", Labels: map[string]string{LabelFleet: "x"}}); err == nil {
		t.Error("reserved label accepted")
	}
	if _, err := e.m.Create(ctx, CreateOptions{Name: "g", Mirrors: []string{"nope"}}); err == nil {
		t.Error("unknown mirror accepted")
	}
	if len(e.kind.Calls()) != calls {
		t.Errorf("invalid requests reached the guest: %q", e.kind.Calls()[calls:])
	}
}

func TestCreateFailureLeavesClearError(t *testing.T) {
	e := newEnv(t)
	e.kind.failOn = "kind create cluster"
	_, err := e.m.Create(context.Background(), CreateOptions{Name: "dev"})
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(e.m.KubeconfigPath("dev")); !os.IsNotExist(err) {
		t.Error("kubeconfig written after failed create")
	}
	e.kind.failOn = "docker exec"
	_, err = e.m.Create(context.Background(), CreateOptions{Name: "dev"})
	if err == nil || !strings.Contains(err.Error(), "klimax cluster delete dev --yes") {
		t.Errorf("partial failure should say how to clean up: %v", err)
	}
}

func TestDeleteExactSequenceAndCleanup(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	os.MkdirAll(filepath.Dir(e.m.KubeConfig), 0o700)
	os.WriteFile(e.m.KubeConfig, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster: {server: 'https://x'}\nusers:\n- name: other\n  user: {token: t}\ncontexts:\n- name: other\n  context: {cluster: other, user: other}\ncurrent-context: other\n"), 0o600)
	if _, err := e.m.Create(ctx, CreateOptions{Name: "dev"}); err != nil {
		t.Fatal(err)
	}
	before := len(e.kind.Calls())
	if err := e.m.Delete(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	if got := e.kind.Calls()[before:]; !reflect.DeepEqual(got, []string{"kind delete cluster --name dev"}) {
		t.Errorf("delete commands %q", got)
	}
	if _, err := os.Stat(e.m.KubeconfigPath("dev")); !os.IsNotExist(err) {
		t.Error("kubeconfig file left behind")
	}
	merged, _ := os.ReadFile(e.m.KubeConfig)
	if bytes.Contains(merged, []byte("kind-dev")) || !bytes.Contains(merged, []byte("name: other")) {
		t.Errorf("merged kubeconfig after delete:\n%s", merged)
	}
	if err := e.m.Delete(ctx, "dev"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
}

func TestKindKubeconfigFlagKeepsKindAwayFromUserConfig(t *testing.T) {
	e := newEnv(t)
	e.m.KindKubeconfig = "/home/u/.klimax/kind.kubeconfig"
	ctx := context.Background()
	if _, err := e.m.Create(ctx, CreateOptions{Name: "dev", Mirrors: []string{}}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Delete(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kind create cluster --name dev --config - --kubeconfig /home/u/.klimax/kind.kubeconfig",
		"kind get kubeconfig --name dev",
		"kind delete cluster --name dev --kubeconfig /home/u/.klimax/kind.kubeconfig",
	}
	if got := e.kind.Calls(); !reflect.DeepEqual(got, want) {
		t.Errorf("got %q", got)
	}
}

func TestListAndLabel(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, o := range []CreateOptions{{Name: "a", Region: "eu"}, {Name: "b", Region: "us", Fleet: "f1"}} {
		info, err := e.m.Create(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		// kind applies node labels from the config; the fake API mirrors that.
		k, _ := e.kubes.New([]byte("server: " + info.Server))
		k.LabelNode(ctx, info.Labels, nil)
	}
	all, err := e.m.List(ctx, "")
	if err != nil || len(all) != 2 || all[0].Name != "a" || all[1].Fleet != "f1" || all[1].Slot != 2 || !all[0].Reachable {
		t.Fatalf("list %+v %v", all, err)
	}
	eu, _ := e.m.List(ctx, LabelRegion+"=eu")
	if len(eu) != 1 || eu[0].Name != "a" {
		t.Errorf("selector: %+v", eu)
	}
	if _, err := e.m.List(ctx, "=bad=="); err == nil {
		t.Error("bad selector accepted")
	}
	if err := e.m.Label(ctx, "a", map[string]string{"tier": "gold"}, nil, false); err != nil {
		t.Fatal(err)
	}
	gold, _ := e.m.List(ctx, "tier=gold")
	if len(gold) != 1 || gold[0].Name != "a" {
		t.Errorf("after label: %+v", gold)
	}
	if err := e.m.Label(ctx, "a", nil, []string{"tier"}, false); err != nil {
		t.Fatal(err)
	}
	if gold, _ := e.m.List(ctx, "tier=gold"); len(gold) != 0 {
		t.Errorf("label not removed: %+v", gold)
	}
	if err := e.m.Label(ctx, "a", map[string]string{LabelFleet: "x"}, nil, false); err == nil {
		t.Error("reserved label set")
	}
	// A missing per-cluster kubeconfig is re-fetched from kind.
	os.Remove(e.m.KubeconfigPath("a"))
	if l, _ := e.m.List(ctx, ""); !l[0].Reachable {
		t.Errorf("not re-fetched: %+v", l[0])
	}
	if err := e.m.Label(ctx, "zzz", map[string]string{"a": "b"}, nil, false); err == nil {
		t.Error("label on missing cluster")
	}
}
