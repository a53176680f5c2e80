package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/cluster/clustertest"
	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
)

func newEnv(t *testing.T) *clustertest.Env {
	t.Helper()
	cfg := config.Default()
	cfg.Kind.CustomDNSResolvers = []config.DNSResolver{{Domain: "runlocal.dev", Resolvers: []string{"8.8.8.8", "8.8.4.4"}}}
	return clustertest.NewEnv(t, cfg)
}

func TestCreateExactCommandSequence(t *testing.T) {
	e := newEnv(t)
	os.MkdirAll(filepath.Dir(e.M.KubeConfig), 0o700)
	os.WriteFile(e.M.KubeConfig, []byte("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\ncurrent-context: \"\"\nmine: keep\n"), 0o600)
	info, err := e.M.Create(context.Background(), cluster.CreateOptions{Name: "dev", Region: "eu", Zone: "eu-1", Labels: map[string]string{"team": "a"},
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
	if got := e.Kind.Calls(); !reflect.DeepEqual(got, want) {
		t.Errorf("guest commands:\n got %q\nwant %q", got, want)
	}
	// kind got exactly the golden-tested config for this spec.
	kc, _ := cluster.KindConfig(cluster.Spec{Name: "dev", Slot: 1, NodeVersion: "v1.35.0", Region: "eu", Zone: "eu-1", Labels: map[string]string{"team": "a"}, ListenAddress: "0.0.0.0", APIHost: "192.168.64.3"})
	wantCfg, _ := kc.Render()
	if got := e.Kind.Stdin["kind create cluster --name dev --config -"]; got != string(wantCfg) {
		t.Errorf("kind config on stdin:\n%s", got)
	}
	if got := e.Kind.Files["dev-control-plane:/etc/containerd/certs.d/docker.io/hosts.toml"]; got != string(cluster.HostsTOML(config.DefaultMirrors()[0]).Content) {
		t.Errorf("hosts.toml written: %q", got)
	}
	kube := e.Kubes.ByURL["https://192.168.64.3:7001"]
	if kube == nil {
		t.Fatalf("no client for the rewritten server; have %v", e.Kubes.ByURL)
	}
	wantKube := []string{
		"apply Namespace /metallb-system", "apply Deployment metallb-system/controller",
		"wait metallb-system/controller",
		"apply IPAddressPool metallb-system/klimax", "pool 172.30.1.1-172.30.1.7,172.30.1.16-172.30.1.254",
		"apply L2Advertisement metallb-system/klimax",
		"set corefile",
	}
	if !reflect.DeepEqual(kube.Log, wantKube) {
		t.Errorf("API calls:\n got %q\nwant %q", kube.Log, wantKube)
	}
	if !strings.Contains(kube.CorefileText(), "runlocal.dev:53 {") || !strings.Contains(kube.CorefileText(), "forward . /etc/resolv.conf") {
		t.Errorf("corefile:\n%s", kube.CorefileText())
	}
	// Per-cluster kubeconfig: 0600, server rewritten; merged with the user's keys kept.
	st, err := os.Stat(e.M.KubeconfigPath("dev"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig file: %v %v", err, st)
	}
	data, _ := os.ReadFile(e.M.KubeconfigPath("dev"))
	if s, _ := kubeconfig.Server(data, ""); s != "https://192.168.64.3:7001" {
		t.Errorf("server %q", s)
	}
	merged, _ := os.ReadFile(e.M.KubeConfig)
	if !bytes.Contains(merged, []byte("name: kind-dev")) || !bytes.Contains(merged, []byte("mine: keep")) {
		t.Errorf("merged kubeconfig:\n%s", merged)
	}
	if info.Slot != 1 || info.APIPort != 7001 || info.Labels[cluster.LabelRegion] != "eu" {
		t.Errorf("info %+v", info)
	}
}

func TestCreateSlotsAndDuplicates(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, n := range []string{"a", "b", "c"} {
		if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	if *e.Downloads != 1 {
		t.Errorf("MetalLB manifest downloaded %d times, want once (cached)", *e.Downloads)
	}
	if err := e.M.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	info, err := e.M.Create(ctx, cluster.CreateOptions{Name: "d"})
	if err != nil || info.Slot != 2 {
		t.Errorf("d got slot %v (%v), want lowest free 2", info, err)
	}
	if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: "e", Slot: 3}); err == nil || !strings.Contains(err.Error(), "slot 3 is already in use") {
		t.Errorf("pinned used slot: %v", err)
	}
	info, err = e.M.Create(ctx, cluster.CreateOptions{Name: "f", Slot: 42})
	if err != nil || info.APIPort != 7042 {
		t.Errorf("pinned 42: %+v %v", info, err)
	}
	if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: "a"}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("duplicate: %v", err)
	}
	calls := len(e.Kind.Calls())
	for _, bad := range []string{"Bad", "a;reboot", "$(id)", ""} {
		if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: bad}); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
	if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: "g", Labels: map[string]string{cluster.LabelFleet: "x"}}); err == nil {
		t.Error("reserved label accepted")
	}
	if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: "g", Mirrors: []string{"nope"}}); err == nil {
		t.Error("unknown mirror accepted")
	}
	if len(e.Kind.Calls()) != calls {
		t.Errorf("invalid requests reached the guest: %q", e.Kind.Calls()[calls:])
	}
}

func TestCreateFailureLeavesClearError(t *testing.T) {
	e := newEnv(t)
	e.Kind.FailOn = "kind create cluster"
	_, err := e.M.Create(context.Background(), cluster.CreateOptions{Name: "dev"})
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(e.M.KubeconfigPath("dev")); !os.IsNotExist(err) {
		t.Error("kubeconfig written after failed create")
	}
	e.Kind.FailOn = "docker exec"
	_, err = e.M.Create(context.Background(), cluster.CreateOptions{Name: "dev"})
	if err == nil || !strings.Contains(err.Error(), "klimax cluster delete dev --yes") {
		t.Errorf("partial failure should say how to clean up: %v", err)
	}
}

func TestDeleteExactSequenceAndCleanup(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	os.MkdirAll(filepath.Dir(e.M.KubeConfig), 0o700)
	os.WriteFile(e.M.KubeConfig, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster: {server: 'https://x'}\nusers:\n- name: other\n  user: {token: t}\ncontexts:\n- name: other\n  context: {cluster: other, user: other}\ncurrent-context: other\n"), 0o600)
	if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: "dev"}); err != nil {
		t.Fatal(err)
	}
	before := len(e.Kind.Calls())
	if err := e.M.Delete(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	if got := e.Kind.Calls()[before:]; !reflect.DeepEqual(got, []string{"kind delete cluster --name dev"}) {
		t.Errorf("delete commands %q", got)
	}
	if _, err := os.Stat(e.M.KubeconfigPath("dev")); !os.IsNotExist(err) {
		t.Error("kubeconfig file left behind")
	}
	merged, _ := os.ReadFile(e.M.KubeConfig)
	if bytes.Contains(merged, []byte("kind-dev")) || !bytes.Contains(merged, []byte("name: other")) {
		t.Errorf("merged kubeconfig after delete:\n%s", merged)
	}
	if err := e.M.Delete(ctx, "dev"); !errors.Is(err, cluster.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
}

func TestKindKubeconfigFlagKeepsKindAwayFromUserConfig(t *testing.T) {
	e := newEnv(t)
	e.M.KindKubeconfig = "/home/u/.klimax/kind.kubeconfig"
	ctx := context.Background()
	if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: "dev", Mirrors: []string{}}); err != nil {
		t.Fatal(err)
	}
	if err := e.M.Delete(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kind create cluster --name dev --config - --kubeconfig /home/u/.klimax/kind.kubeconfig",
		"kind get kubeconfig --name dev",
		"kind delete cluster --name dev --kubeconfig /home/u/.klimax/kind.kubeconfig",
	}
	if got := e.Kind.Calls(); !reflect.DeepEqual(got, want) {
		t.Errorf("got %q", got)
	}
}

func TestListAndLabel(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, o := range []cluster.CreateOptions{{Name: "a", Region: "eu"}, {Name: "b", Region: "us", Fleet: "f1"}} {
		info, err := e.M.Create(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		// kind applies node labels from the config; the fake API mirrors that.
		k, _ := e.Kubes.New([]byte("server: " + info.Server))
		k.LabelNode(ctx, info.Labels, nil)
	}
	all, err := e.M.List(ctx, "")
	if err != nil || len(all) != 2 || all[0].Name != "a" || all[1].Fleet != "f1" || all[1].Slot != 2 || !all[0].Reachable {
		t.Fatalf("list %+v %v", all, err)
	}
	eu, _ := e.M.List(ctx, cluster.LabelRegion+"=eu")
	if len(eu) != 1 || eu[0].Name != "a" {
		t.Errorf("selector: %+v", eu)
	}
	if _, err := e.M.List(ctx, "=bad=="); err == nil {
		t.Error("bad selector accepted")
	}
	if err := e.M.Label(ctx, "a", map[string]string{"tier": "gold"}, nil, false); err != nil {
		t.Fatal(err)
	}
	gold, _ := e.M.List(ctx, "tier=gold")
	if len(gold) != 1 || gold[0].Name != "a" {
		t.Errorf("after label: %+v", gold)
	}
	if err := e.M.Label(ctx, "a", nil, []string{"tier"}, false); err != nil {
		t.Fatal(err)
	}
	if gold, _ := e.M.List(ctx, "tier=gold"); len(gold) != 0 {
		t.Errorf("label not removed: %+v", gold)
	}
	if err := e.M.Label(ctx, "a", map[string]string{cluster.LabelFleet: "x"}, nil, false); err == nil {
		t.Error("reserved label set")
	}
	// A missing per-cluster kubeconfig is re-fetched from kind, and list,
	// a read-only command, does not write it back.
	os.Remove(e.M.KubeconfigPath("a"))
	if l, _ := e.M.List(ctx, ""); !l[0].Reachable || l[0].Kubeconfig != "" {
		t.Errorf("not re-fetched, or a kubeconfig file reported: %+v", l[0])
	}
	if _, err := os.Stat(e.M.KubeconfigPath("a")); !os.IsNotExist(err) {
		t.Errorf("cluster list wrote %s (stat: %v)", e.M.KubeconfigPath("a"), err)
	}
	if _, err := e.M.Kubeconfig(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.M.KubeconfigPath("a")); err != nil {
		t.Errorf("kubeconfig path/use must still write the file: %v", err)
	}
	if err := e.M.Label(ctx, "zzz", map[string]string{"a": "b"}, nil, false); err == nil {
		t.Error("label on missing cluster")
	}
}

func TestE2ENginxFlow(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	info, err := e.M.Create(ctx, cluster.CreateOptions{Name: "dev", Mirrors: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	k := e.Kubes.ByURL[info.Server]
	k.LBIP = "172.30.1.16"
	var got []string
	ip, err := e.M.E2ENginx(ctx, "dev", true, func(ctx context.Context, url string) (int, string, error) {
		got = append(got, url)
		return 200, "<title>Welcome to nginx!</title>", nil
	})
	if err != nil || ip != "172.30.1.16" || len(got) != 1 || got[0] != "http://172.30.1.16/" {
		t.Fatalf("ip %q err %v gets %v", ip, err, got)
	}
	tail := k.Log[len(k.Log)-7:]
	want := []string{"apply Namespace /klimax-e2e", "apply Deployment klimax-e2e/nginx", "apply Service klimax-e2e/nginx",
		"wait klimax-e2e/nginx", "delete Service nginx", "delete Deployment nginx", "delete Namespace klimax-e2e"}
	if strings.Join(tail, "|") != strings.Join(want, "|") {
		t.Errorf("api calls %q", tail)
	}
}

// TestCreateRefusedByPreflight: a failing preflight (no klimax network yet)
// stops create before kind runs anything.
func TestCreateRefusedByPreflight(t *testing.T) {
	e := newEnv(t)
	e.M.Preflight = func(context.Context) error {
		return errors.New("docker network kind does not exist: run `klimax up` first")
	}
	_, err := e.M.Create(context.Background(), cluster.CreateOptions{Name: "a"})
	if err == nil || !strings.Contains(err.Error(), "klimax up") {
		t.Fatalf("err = %v", err)
	}
	if calls := e.Kind.Calls(); len(calls) != 0 {
		t.Fatalf("kind ran before the preflight passed: %q", calls)
	}
}
