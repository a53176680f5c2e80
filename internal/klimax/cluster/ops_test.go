package cluster_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/cluster/clustertest"
)

// Workers are rendered into the kind config (kind names them
// <name>-worker, -worker2), labelled like the control plane minus its
// ingress/dependency labels, and get the mirrors' hosts.toml too.
func TestCreateWithWorkers(t *testing.T) {
	e := newEnv(t)
	_, err := e.M.Create(context.Background(), cluster.CreateOptions{Name: "dev", Workers: 2, Region: "eu",
		Fleet: "f", DependsOn: []string{"mgmt"}, Mirrors: []string{"registry-dockerio"}})
	if err != nil {
		t.Fatal(err)
	}
	var kc cluster.KindCluster
	if err := yaml.Unmarshal([]byte(e.Kind.Stdin["kind create cluster --name dev --config -"]), &kc); err != nil {
		t.Fatal(err)
	}
	if len(kc.Nodes) != 3 || kc.Nodes[1].Role != "worker" || kc.Nodes[2].Role != "worker" || kc.Nodes[1].Image != kc.Nodes[0].Image {
		t.Fatalf("nodes: %+v", kc.Nodes)
	}
	w := kc.Nodes[1].Labels
	if w[cluster.LabelRegion] != "eu" || w[cluster.LabelManagedBy] != "klimax" || w[cluster.LabelIngress] != "" || w["deps.klimax.dev/mgmt"] != "" {
		t.Errorf("worker labels: %v", w)
	}
	for _, node := range []string{"dev-control-plane", "dev-worker", "dev-worker2"} {
		if e.Kind.Files[node+":/etc/containerd/certs.d/docker.io/hosts.toml"] == "" {
			t.Errorf("no hosts.toml on %s", node)
		}
	}
	for _, n := range []int{-1, cluster.MaxWorkers + 1} {
		_, err := e.M.Create(context.Background(), cluster.CreateOptions{Name: "x", Workers: n})
		if err == nil || !strings.Contains(err.Error(), "workers") || !strings.Contains(err.Error(), "fix:") {
			t.Errorf("workers %d: %v", n, err)
		}
	}
}

// --wait waits for nodes and kube-system pods; a cluster that never gets
// ready fails after the duration with what to do next.
func TestCreateWait(t *testing.T) {
	e := newEnv(t)
	if _, err := e.M.Create(context.Background(), cluster.CreateOptions{Name: "dev", Wait: time.Minute}); err != nil {
		t.Fatal(err)
	}
	kube := e.Kubes.ByURL["https://192.168.64.3:7001"]
	if log := kube.Log; log[len(log)-1] != "wait ready" {
		t.Errorf("no readiness wait at the end: %q", log)
	}
	// Not asked to wait: no wait.
	if _, err := e.M.Create(context.Background(), cluster.CreateOptions{Name: "stg"}); err != nil {
		t.Fatal(err)
	}
	for _, l := range e.Kubes.ByURL["https://192.168.64.3:7002"].Log {
		if l == "wait ready" {
			t.Error("waited without --wait")
		}
	}
	api, _ := e.Kubes.New([]byte("server: https://192.168.64.3:7003"))
	api.(*clustertest.API).NotReady = "pod kube-system/coredns-1"
	start := time.Now()
	_, err := e.M.Create(context.Background(), cluster.CreateOptions{Name: "slow", Wait: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "not ready after 200ms") || !strings.Contains(err.Error(), "coredns-1") || !strings.Contains(err.Error(), "klimax cluster logs slow") {
		t.Errorf("never-ready cluster: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Error("wait did not end at its duration")
	}
}

// stop stops every node container (workers first), start brings them back
// (control plane first) and waits for the API; both refuse unknown names.
func TestStopStart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: "dev", Workers: 1}); err != nil {
		t.Fatal(err)
	}
	before := len(e.Kind.Calls())
	stopped, err := e.M.Stop(ctx, "dev")
	if err != nil || !reflect.DeepEqual(stopped, []string{"dev-worker", "dev-control-plane"}) {
		t.Fatalf("stop: %v %v", stopped, err)
	}
	ex, _ := e.M.Existing(ctx)
	if ex["dev"].State != "exited" {
		t.Errorf("state after stop: %+v", ex["dev"])
	}
	// A stopped cluster is listed as such, and loads are refused with the fix.
	infos, _ := e.M.List(ctx, "")
	if len(infos) != 1 || infos[0].State != "exited" || infos[0].Reachable {
		t.Errorf("list: %+v", infos)
	}
	if err := e.M.Load(ctx, "dev", []string{"app:1"}); err == nil || !strings.Contains(err.Error(), "klimax cluster start dev") {
		t.Errorf("load into a stopped cluster: %v", err)
	}
	again, err := e.M.Stop(ctx, "dev")
	if err != nil || len(again) != 0 {
		t.Errorf("second stop: %v %v", again, err)
	}
	os.Remove(e.M.KubeconfigPath("dev")) // re-fetched after start
	if err := e.M.Start(ctx, "dev", time.Minute); err != nil {
		t.Fatal(err)
	}
	want := []string{"docker-api stop dev-worker", "docker-api stop dev-control-plane",
		"docker-api start dev-control-plane", "docker-api start dev-worker", "kind get kubeconfig --name dev"}
	if got := e.Kind.Calls()[before:]; !reflect.DeepEqual(got, want) {
		t.Errorf("calls:\n got %q\nwant %q", got, want)
	}
	if log := e.Kubes.ByURL["https://192.168.64.3:7001"].Log; log[len(log)-1] != "wait ready" {
		t.Errorf("start did not wait: %q", log)
	}
	for _, f := range []func() error{
		func() error { _, err := e.M.Stop(ctx, "nope"); return err },
		func() error { return e.M.Start(ctx, "nope", 0) },
		func() error { return e.M.Load(ctx, "nope", []string{"a:1"}) },
		func() error { _, err := e.M.Logs(ctx, "nope", t.TempDir()); return err },
	} {
		if err := f(); !errors.Is(err, cluster.ErrNotFound) || !strings.Contains(err.Error(), "klimax cluster list") {
			t.Errorf("unknown cluster: %v", err)
		}
	}
	// Never ready after start: the error says so and how to get logs.
	e.Kubes.ByURL["https://192.168.64.3:7001"].NotReady = "node dev-worker"
	e.M.Stop(ctx, "dev")
	if err := e.M.Start(ctx, "dev", 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "node dev-worker") {
		t.Errorf("start never ready: %v", err)
	}
}

func TestLoad(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: "dev"}); err != nil {
		t.Fatal(err)
	}
	e.Kind.Images["example.com/app:dev"] = true
	e.Kind.Images["nginx:1.27"] = true
	if err := e.M.Load(ctx, "dev", []string{"example.com/app:dev", "nginx:1.27"}); err != nil {
		t.Fatal(err)
	}
	if calls := e.Kind.Calls(); calls[len(calls)-1] != "kind load docker-image --name dev example.com/app:dev nginx:1.27" {
		t.Errorf("calls: %q", calls)
	}
	if got := e.Kind.Loaded["dev"]; !reflect.DeepEqual(got, []string{"example.com/app:dev", "nginx:1.27"}) {
		t.Errorf("loaded %v", got)
	}
	n := len(e.Kind.Calls())
	for img, want := range map[string]string{"missing:1": "not in the machine's Docker engine", "--help": "not an image reference", "UPPER:x": "fix:", "": "not an image"} {
		if err := e.M.Load(ctx, "dev", []string{img}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v", img, err)
		}
	}
	if len(e.Kind.Calls()) != n {
		t.Errorf("kind ran for refused images: %q", e.Kind.Calls()[n:])
	}
	// Without the pre-check, the fake fails as kind does.
	e.M.ImageExists = nil
	if err := e.M.Load(ctx, "dev", []string{"missing:1"}); err == nil || !strings.Contains(err.Error(), "not present locally") {
		t.Errorf("kind's own refusal: %v", err)
	}
}

func TestLogsFromVMAndHost(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: "dev"}); err != nil {
		t.Fatal(err)
	}
	check := func(dir string) {
		t.Helper()
		for rel, content := range clustertest.ExportedLogs("dev") {
			got, err := os.ReadFile(filepath.Join(dir, rel))
			if err != nil || string(got) != content {
				t.Errorf("%s: %q %v", rel, got, err)
			}
		}
	}
	// VM: exported in the guest, streamed back as a tar, guest dir removed.
	dir := filepath.Join(t.TempDir(), "logs")
	got, err := e.M.Logs(ctx, "dev", dir)
	if err != nil || got != dir {
		t.Fatalf("logs: %q %v", got, err)
	}
	check(dir)
	if left := e.Kind.GuestLogDirs(); len(left) != 0 {
		t.Errorf("guest dirs left: %v", left)
	}
	if _, err := e.M.Logs(ctx, "dev", dir); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("non-empty dir: %v", err)
	}
	// Host: kind writes the directory itself.
	e.M.LocalMachine, e.Kind.LocalMachine = true, true
	dir2 := filepath.Join(t.TempDir(), "host-logs")
	if _, err := e.M.Logs(ctx, "dev", dir2); err != nil {
		t.Fatal(err)
	}
	check(dir2)
	if calls := e.Kind.Calls(); calls[len(calls)-1] != "kind export logs "+dir2+" --name dev" {
		t.Errorf("calls %q", calls[len(calls)-1])
	}
}
