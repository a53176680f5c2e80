package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/k3sm-dev/k3sm/internal/version"
	"k8s.io/klog/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/cluster/clustertest"
	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/platform"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
)

// fakePlatform stands in for the VM/Docker facade (tested by its own
// package); it records calls and runs guest commands on the fake kind.
type fakePlatform struct {
	calls  []string
	checks []platform.Check
	guest  vm.Runner
}

func (f *fakePlatform) Up(ctx context.Context, p platform.Progress) error {
	f.calls = append(f.calls, "up")
	done := p("start machine")
	done(nil)
	return nil
}
func (f *fakePlatform) Down(ctx context.Context, rr bool) error {
	f.calls = append(f.calls, "down route="+map[bool]string{true: "remove", false: "keep"}[rr])
	return nil
}
func (f *fakePlatform) Destroy(ctx context.Context) error {
	f.calls = append(f.calls, "destroy")
	return nil
}
func (f *fakePlatform) Status(ctx context.Context) (*platform.Status, error) {
	return &platform.Status{Driver: "host", Machine: vm.State{Name: "h", Phase: vm.PhaseRunning}, Engine: platform.EngineStatus{Reachable: true, Version: "28"}}, nil
}
func (f *fakePlatform) Doctor(ctx context.Context) []platform.Check { return f.checks }
func (f *fakePlatform) Shell(ctx context.Context, args []string) error {
	f.calls = append(f.calls, "shell "+strings.Join(args, " "))
	if len(args) > 0 && args[0] == "sh" {
		// What the host driver does: run it here.
		return exec.CommandContext(ctx, args[0], args[1:]...).Run()
	}
	return nil
}
func (f *fakePlatform) DockerEnv(unset bool) string {
	if unset {
		return "unset DOCKER_HOST\n"
	}
	return "export DOCKER_HOST=unix:///x.sock\n"
}
func (f *fakePlatform) DockerContext(ctx context.Context, unset bool) (string, error) {
	return "context klimax", nil
}
func (f *fakePlatform) CleanCache(ctx context.Context) error {
	f.calls = append(f.calls, "clean")
	return nil
}
func (f *fakePlatform) Guest() vm.Runner                            { return f.guest }
func (f *fakePlatform) APIHost(ctx context.Context) (string, error) { return "192.168.64.3", nil }
func (f *fakePlatform) DockerHost() string                          { return "" }
func (f *fakePlatform) Driver() vm.Driver                           { return vm.NewHost() }

type harness struct {
	t    *testing.T
	env  *clustertest.Env
	plat *fakePlatform
	home string
}

func newHarness(t *testing.T) *harness {
	cfg := config.Default()
	env := clustertest.NewEnv(t, cfg)
	plat := &fakePlatform{guest: env.Kind, checks: []platform.Check{{Name: "machine", Status: platform.Pass}}}
	return &harness{t: t, env: env, plat: plat, home: env.Home}
}

// run executes klimax args; stdin "" and no TTY unless tty.
func (h *harness) run(stdin string, tty bool, args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	app := &App{Streams: Streams{In: strings.NewReader(stdin), Out: &out, Err: &errb, InTTY: tty}, Home: h.home,
		NewPlatform: func(*config.Config) (Platform, error) { return h.plat, nil },
		NewClusters: func(cfg *config.Config, p Platform) (*cluster.Manager, error) {
			h.env.M.Config = cfg
			return h.env.M, nil
		}}
	root := NewRoot(app)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	if err != nil {
		if _, silent := err.(*ExitError); !silent {
			errb.WriteString("Error: " + err.Error() + "\n")
		}
	}
	return out.String(), errb.String(), ExitCode(err)
}

func TestClusterLifecycleThroughCLI(t *testing.T) {
	h := newHarness(t)
	out, errs, code := h.run("", false, "cluster", "create", "dev", "--region", "eu", "--zone", "eu-1", "-l", "team=a")
	if code != 0 || !strings.Contains(out, "cluster dev ready: slot 1") {
		t.Fatalf("create: %d %s %s", code, out, errs)
	}
	if _, _, code := h.run("", false, "cluster", "create", "Bad_Name"); code == 0 {
		t.Error("bad name accepted")
	}
	h.run("", false, "cluster", "create", "stg", "--num", "5")
	out, _, code = h.run("", false, "cluster", "list", "-o", "json")
	var infos []cluster.Info
	if err := json.Unmarshal([]byte(out), &infos); err != nil || code != 0 {
		t.Fatalf("list json: %v\n%s", err, out)
	}
	if len(infos) != 2 || infos[0].Name != "dev" || infos[0].Region != "eu" || infos[0].Labels["team"] != "a" || infos[1].Slot != 5 {
		t.Errorf("list: %+v", infos)
	}
	out, _, _ = h.run("", false, "cluster", "list", "-l", "team=a")
	if !strings.Contains(out, "dev") || strings.Contains(out, "stg") {
		t.Errorf("selector list:\n%s", out)
	}
	out, _, _ = h.run("", false, "cluster", "list", "-o", "yaml")
	if !strings.Contains(out, "name: dev") {
		t.Errorf("yaml list:\n%s", out)
	}
	if _, errs, code := h.run("", false, "cluster", "label", "dev", "-l", "tier=gold", "-l", "team-"); code != 0 {
		t.Fatalf("label: %s", errs)
	}
	out, _, _ = h.run("", false, "cluster", "list", "-l", "tier=gold,!team")
	if !strings.Contains(out, "dev") {
		t.Errorf("after label:\n%s", out)
	}
	// No name, not a terminal: refuse clearly, delete nothing.
	_, errs, code = h.run("", false, "cluster", "delete")
	if code == 0 || !strings.Contains(errs, "picker needs a terminal") {
		t.Errorf("non-TTY delete without name: %d %s", code, errs)
	}
	// Selector delete needs --yes off a terminal.
	if _, errs, code := h.run("", false, "cluster", "delete", "-l", "tier=gold"); code == 0 || !strings.Contains(errs, "--yes") {
		t.Errorf("selector delete without --yes: %s", errs)
	}
	// Picker on a "terminal": select the second entry (stg) and confirm.
	out, errs, code = h.run("j \r", true, "cluster", "delete")
	if code != 0 || !strings.Contains(out, "deleted cluster stg") {
		t.Errorf("picker delete: %d %s %s", code, out, errs)
	}
	merged, _ := os.ReadFile(filepath.Join(h.home, ".kube", "config"))
	if !strings.Contains(string(merged), "kind-dev") || strings.Contains(string(merged), "kind-stg") {
		t.Errorf("merged kubeconfig:\n%s", merged)
	}
	if _, _, code := h.run("", false, "cluster", "delete", "dev"); code != 0 {
		t.Error("delete dev")
	}
	if _, errs, code := h.run("", false, "cluster", "delete", "dev"); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("delete missing: %s", errs)
	}
}

func TestDoctorExitCodeAndJSON(t *testing.T) {
	h := newHarness(t)
	out, _, code := h.run("", false, "doctor")
	if code != 0 || !strings.Contains(out, "PASS") {
		t.Errorf("all pass: %d\n%s", code, out)
	}
	h.plat.checks = append(h.plat.checks, platform.Check{Name: "host route", Status: platform.Fail, Detail: "missing", Fix: "run `klimax up`"})
	out, _, code = h.run("", false, "doctor")
	if code != 1 || !strings.Contains(out, "FAIL") || !strings.Contains(out, "fix: run `klimax up`") {
		t.Errorf("fail: %d\n%s", code, out)
	}
	out, _, code = h.run("", false, "doctor", "-o", "json")
	var checks []platform.Check
	if err := json.Unmarshal([]byte(out), &checks); err != nil || code != 1 || checks[len(checks)-1].Fix == "" {
		t.Errorf("json: %v %d %s", err, code, out)
	}
	out, _, code = h.run("", false, "doctor", "-o", "yaml")
	if code != 1 || !strings.Contains(out, "fix: run `klimax up`") || !strings.Contains(out, "status: FAIL") {
		t.Errorf("yaml: %d %s", code, out)
	}
	os.MkdirAll(filepath.Join(h.home, ".klimax"), 0o700)
	os.WriteFile(filepath.Join(h.home, ".klimax", "config.yaml"), []byte("vm:\n  cpus: 0\n"), 0o600)
	out, _, code = h.run("", false, "doctor")
	if code != 1 || !strings.Contains(out, "vm.cpus") {
		t.Errorf("bad config: %d\n%s", code, out)
	}
}

func TestFleetThroughCLI(t *testing.T) {
	h := newHarness(t)
	manifest := filepath.Join(h.home, "fleet.yaml")
	os.WriteFile(manifest, []byte(`apiVersion: klimax.dev/v1alpha1
kind: Fleet
metadata: {name: demo}
spec:
  maxParallel: 2
  clusters:
  - mgmt
  - {name: app1, dependsOn: [mgmt], num: 9}
  - {name: app2, dependsOn: [mgmt]}
`), 0o600)
	out, _, code := h.run("", false, "fleet", "create", "-f", manifest, "--dry-run")
	if code != 0 || !strings.Contains(out, "dry run") || !strings.Contains(out, "10.9.0.0/16") || len(h.env.Kind.Calls()) != 0 {
		t.Fatalf("dry run: %d\n%s\ncalls %v", code, out, h.env.Kind.Calls())
	}
	h.run("", false, "cluster", "create", "app2")
	out, errs, code := h.run("", false, "cluster", "apply", "-f", manifest)
	if code != 0 || !strings.Contains(out, "warning: cluster app2 exists and is not a member") {
		t.Fatalf("apply: %d %s %s", code, out, errs)
	}
	out, _, _ = h.run("", false, "fleet", "list", "-o", "json")
	var fs []fleetSummary
	json.Unmarshal([]byte(out), &fs)
	if len(fs) != 1 || strings.Join(fs[0].Clusters, ",") != "app1,mgmt" {
		t.Errorf("fleet list %s", out)
	}
	if _, errs, code := h.run("", false, "fleet", "adopt", "demo", "app2"); code != 0 {
		t.Fatal(errs)
	}
	out, _, _ = h.run("", false, "fleet", "describe", "demo")
	if !strings.Contains(out, "3 clusters") || !strings.Contains(out, "app1") {
		t.Errorf("describe:\n%s", out)
	}
	if _, errs, code := h.run("", false, "fleet", "label", "demo", "-l", "env=dev"); code != 0 {
		t.Fatal(errs)
	}
	if out, _, _ := h.run("", false, "cluster", "list", "-l", "env=dev", "-o", "json"); strings.Count(out, `"name"`) != 3 {
		t.Errorf("fleet label:\n%s", out)
	}
	if _, errs, code := h.run("", false, "fleet", "delete", "demo"); code == 0 || !strings.Contains(errs, "--yes") {
		t.Errorf("delete without --yes: %s", errs)
	}
	before := len(h.env.Kind.Calls())
	if _, errs, code := h.run("", false, "fleet", "delete", "demo", "--yes"); code != 0 {
		t.Fatal(errs)
	}
	var deletes []string
	for _, c := range h.env.Kind.Calls()[before:] {
		if strings.HasPrefix(c, "kind delete cluster") {
			deletes = append(deletes, strings.Fields(c)[4])
		}
	}
	if len(deletes) != 3 || deletes[2] != "mgmt" {
		t.Errorf("delete order %v: mgmt (the dependency) must go last", deletes)
	}
}

func TestKubeconfigCommands(t *testing.T) {
	h := newHarness(t)
	h.env.M.Config = config.Default()
	h.run("", false, "cluster", "create", "dev")
	out, _, _ := h.run("", false, "kubeconfig", "path", "dev")
	if strings.TrimSpace(out) != filepath.Join(h.home, ".kube", "klimax", "dev.kubeconfig") {
		t.Errorf("path %q", out)
	}
	out, _, _ = h.run("", false, "kubeconfig", "env", "dev")
	if !strings.HasPrefix(out, "export KUBECONFIG='") {
		t.Errorf("env %q", out)
	}
	shared := filepath.Join(h.home, ".kube", "config")
	h.run("", false, "kubeconfig", "remove", "dev")
	if b, _ := os.ReadFile(shared); strings.Contains(string(b), "kind-dev") {
		t.Error("remove left the context")
	}
	h.run("", false, "kubeconfig", "merge", "dev")
	if b, _ := os.ReadFile(shared); !strings.Contains(string(b), "name: kind-dev") || strings.Contains(string(b), "current-context: kind-dev") {
		t.Errorf("merge:\n%s", b)
	}
	h.run("", false, "kubeconfig", "use", "dev")
	if b, _ := os.ReadFile(shared); !strings.Contains(string(b), "current-context: kind-dev") {
		t.Errorf("use:\n%s", b)
	}
	// A deleted per-cluster file is re-fetched from kind.
	os.Remove(filepath.Join(h.home, ".kube", "klimax", "dev.kubeconfig"))
	if _, errs, code := h.run("", false, "kubeconfig", "path", "dev"); code != 0 {
		t.Errorf("refetch: %s", errs)
	}
	if _, _, code := h.run("", false, "kubeconfig", "path", "nope"); code == 0 {
		t.Error("unknown cluster")
	}
}

func TestDestroyRemovesEverythingAndNeedsConfirmation(t *testing.T) {
	h := newHarness(t)
	h.run("", false, "cluster", "create", "dev")
	// The user's own kind cluster on the same engine (kind picks a random
	// API port, never a klimax slot port) and its context.
	h.env.Kind.Clusters["mine"] = cluster.NodeContainer{Cluster: "mine", Container: "mine-control-plane", State: "running", APIPort: 43121}
	// One the user made with apiServerPort 7005, a klimax slot port: its
	// node has no klimax.dev/managed-by label, so it is not klimax's.
	h.env.Kind.Clusters["mine2"] = cluster.NodeContainer{Cluster: "mine2", Container: "mine2-control-plane", State: "running", APIPort: 7005}
	mineCtx := "apiVersion: v1\nkind: Config\nclusters:\n- name: kind-mine\n  cluster: {server: 'https://127.0.0.1:43121'}\nusers:\n- name: kind-mine\n  user: {token: t}\ncontexts:\n- name: kind-mine\n  context: {cluster: kind-mine, user: kind-mine}\n"
	if _, err := kubeconfig.Merge(filepath.Join(h.home, ".kube", "config"), []byte(mineCtx), kubeconfig.MergeOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := h.run("", false, "destroy"); code == 0 || !strings.Contains(errs, "--yes") {
		t.Errorf("destroy without --yes: %s", errs)
	}
	if _, errs, code := h.run("n\n", true, "destroy"); code == 0 || !strings.Contains(errs, "not confirmed") {
		t.Errorf("declined: %s", errs)
	}
	if _, errs, code := h.run("", false, "destroy", "--yes"); code != 0 {
		t.Fatal(errs)
	}
	if h.plat.calls[len(h.plat.calls)-1] != "destroy" {
		t.Errorf("calls %v", h.plat.calls)
	}
	if _, ok := h.env.Kind.Clusters["dev"]; ok {
		t.Error("host driver destroy left klimax's cluster")
	}
	if _, ok := h.env.Kind.Clusters["mine"]; !ok || len(h.env.Kind.Clusters) != 2 || h.env.Kind.Clusters["mine2"].Cluster == "" {
		t.Errorf("destroy deleted a kind cluster klimax did not create: %v", h.env.Kind.Clusters)
	}
	b, _ := os.ReadFile(filepath.Join(h.home, ".kube", "config"))
	if !strings.Contains(string(b), "kind-mine") {
		t.Errorf("destroy removed the user's own kind-mine context:\n%s", b)
	}
	files, _ := filepath.Glob(filepath.Join(h.home, ".kube", "klimax", "*"))
	if strings.Contains(string(b), "kind-dev") || len(files) != 0 {
		t.Errorf("leftovers: %v\n%s", files, b)
	}
}

func TestVMCommandsAndCompletion(t *testing.T) {
	h := newHarness(t)
	h.run("", false, "up")
	h.run("", false, "down", "--remove-route")
	h.run("", false, "registry", "clean-cache")
	h.run("", false, "shell", "--", "uname", "-a")
	if got := strings.Join(h.plat.calls, "|"); got != "up|down route=remove|clean|shell uname -a" {
		t.Errorf("calls %q", got)
	}
	if out, _, _ := h.run("", false, "docker-env", "--unset"); out != "unset DOCKER_HOST\n" {
		t.Errorf("docker-env --unset %q", out)
	}
	if out, _, _ := h.run("", false, "version"); !strings.HasPrefix(out, "klimax ") {
		t.Errorf("version %q", out)
	}
	for _, sh := range []string{"bash", "zsh", "fish", "powershell"} {
		out, _, code := h.run("", false, "completion", sh)
		if code != 0 || !strings.Contains(out, "klimax") {
			t.Errorf("completion %s: %d", sh, code)
		}
	}
	out, _, _ := h.run("", false, "status", "-o", "json")
	var st struct {
		Clusters *[]json.RawMessage `json:"clusters"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Clusters == nil {
		t.Errorf("status json: clusters must be a list, even empty (%v): %s", err, out)
	}
}

func TestConfigEditThroughCLI(t *testing.T) {
	h := newHarness(t)
	script := filepath.Join(h.home, "ed.sh")
	os.WriteFile(script, []byte("#!/bin/sh\nsed -i 's/cpus: 4/cpus: 2/' \"$1\"\n"), 0o755)
	t.Setenv("VISUAL", "")
	t.Setenv("EDITOR", script)
	out, errs, code := h.run("", false, "config", "edit")
	if code != 0 || !strings.Contains(out, "saved") {
		t.Fatalf("%d %s %s", code, out, errs)
	}
	out, _, _ = h.run("", false, "config", "view")
	if !strings.Contains(out, "cpus: 2") {
		t.Errorf("view:\n%s", out)
	}
	os.WriteFile(script, []byte("#!/bin/sh\nsed -i 's/cpus: 2/cpuz: 2/' \"$1\"\n"), 0o755)
	_, errs, code = h.run("", false, "config", "edit")
	if code == 0 || !strings.Contains(errs, "vm.cpuz: unknown key") || !strings.Contains(errs, "kept in") {
		t.Errorf("invalid edit: %s", errs)
	}
	if out, _, _ := h.run("", false, "config", "view"); !strings.Contains(out, "cpus: 2") {
		t.Error("invalid edit changed the config")
	}
}

// TestVersionIsTheLinkedOne: the Makefile links the version into
// internal/version (for both binaries); `klimax version` must print it.
func TestVersionIsTheLinkedOne(t *testing.T) {
	old := version.Version
	version.Version = "v1.2.3-test"
	t.Cleanup(func() { version.Version = old })
	h := newHarness(t)
	if out, _, _ := h.run("", false, "version"); strings.TrimSpace(out) != "klimax v1.2.3-test" {
		t.Fatalf("klimax version printed %q, want the linked version v1.2.3-test", out)
	}
}

// TestShellExitCode: `klimax shell -- cmd` exits with cmd's status and adds
// no error line of its own.
func TestShellExitCode(t *testing.T) {
	h := newHarness(t)
	_, errOut, code := h.run("", false, "shell", "--", "sh", "-c", "exit 3")
	if code != 3 || strings.Contains(errOut, "Error") {
		t.Fatalf("exit %d, stderr %q; want 3 and no error line", code, errOut)
	}
	if _, _, code := h.run("", false, "shell", "--", "sh", "-c", "exit 0"); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
}

// TestLibraryLogsOnlyWithDebug: klog lines (client-go's) stay out of the
// output unless --debug, where they go to stderr.
func TestLibraryLogsOnlyWithDebug(t *testing.T) {
	var buf bytes.Buffer
	quietLibraries(false, &buf)
	klog.Error("leaked klog line")
	klog.Flush()
	if buf.Len() != 0 {
		t.Fatalf("without --debug: %q", buf.String())
	}
	quietLibraries(true, &buf)
	klog.Error("debug klog line")
	klog.Flush()
	if !strings.Contains(buf.String(), "debug klog line") {
		t.Fatalf("with --debug: %q", buf.String())
	}
	quietLibraries(false, &buf)
}

// Labels the kubelet refuses are refused by `cluster create` naming the
// flag and the fix, before kind runs (they used to surface as a kubeadm
// timeout after 4 minutes).
func TestCreateRefusesKubeletLabelsNamingTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-l", "app.kubernetes.io/part-of=x"}, []string{"-l: label key \"app.kubernetes.io/part-of\"", "kubelet", "fix: use a key of your own domain, e.g. example.com/part-of"}},
		{[]string{"--region", "eu west"}, []string{"--region", "fix:"}},
		{[]string{"--zone", "-z"}, []string{"--zone", "fix:"}},
	} {
		h := newHarness(t)
		_, errs, code := h.run("", false, append([]string{"cluster", "create", "dev"}, tc.args...)...)
		if code == 0 {
			t.Errorf("%v accepted", tc.args)
		}
		for _, w := range tc.want {
			if !strings.Contains(errs, w) {
				t.Errorf("%v: %q lacks %q", tc.args, errs, w)
			}
		}
		if calls := h.env.Kind.Calls(); len(calls) != 0 {
			t.Errorf("%v ran %q", tc.args, calls)
		}
	}
}

// down on the host driver stops klimax's clusters (not the user's own kind
// clusters, not one the user stopped already) and up starts exactly those
// again; before, down left every cluster running.
func TestDownStopsHostClustersAndUpStartsThem(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"dev", "stg", "idle"} {
		if _, errs, code := h.run("", false, "cluster", "create", n); code != 0 {
			t.Fatal(errs)
		}
	}
	h.env.Kind.Clusters["mine"] = cluster.NodeContainer{Cluster: "mine", Container: "mine-control-plane", State: "running", APIPort: 43121}
	h.env.Kind.Clusters["mine2"] = cluster.NodeContainer{Cluster: "mine2", Container: "mine2-control-plane", State: "running", APIPort: 7005}
	if out, errs, code := h.run("", false, "cluster", "stop", "idle"); code != 0 || !strings.Contains(out, "cluster idle stopped") {
		t.Fatalf("stop idle: %s %s", out, errs)
	}
	out, errs, code := h.run("", false, "down")
	if code != 0 || !strings.Contains(out, "stopped cluster(s) dev, stg; klimax up starts them again") || !strings.Contains(out, "did not create: mine, mine2") {
		t.Fatalf("down: %d %s %s", code, out, errs)
	}
	state := func(n string) string { return h.env.Kind.Clusters[n].State }
	if state("dev") != "exited" || state("stg") != "exited" || state("mine") != "running" || state("mine2") != "running" {
		t.Errorf("after down: dev %s stg %s mine %s", state("dev"), state("stg"), state("mine"))
	}
	if got := h.plat.calls[len(h.plat.calls)-1]; got != "down route=keep" {
		t.Errorf("platform down not called: %v", h.plat.calls)
	}
	out, errs, code = h.run("", false, "up")
	if code != 0 || !strings.Contains(out, "started cluster(s) dev, stg again") {
		t.Fatalf("up: %d %s %s", code, out, errs)
	}
	if state("dev") != "running" || state("stg") != "running" || state("idle") != "exited" {
		t.Errorf("after up: dev %s stg %s idle %s", state("dev"), state("stg"), state("idle"))
	}
	// The record is gone: a second up starts nothing.
	if out, _, _ := h.run("", false, "up"); strings.Contains(out, "started") {
		t.Errorf("second up: %s", out)
	}
}

// The kind/k3d-style day-2 commands through the CLI, against the fake.
func TestClusterDay2Commands(t *testing.T) {
	h := newHarness(t)
	out, errs, code := h.run("", false, "cluster", "create", "dev", "--workers", "2", "--wait", "1m")
	if code != 0 {
		t.Fatalf("create: %s %s", out, errs)
	}
	if len(h.env.Kind.Workers["dev"]) != 2 {
		t.Errorf("workers: %+v", h.env.Kind.Workers)
	}
	for _, bad := range [][]string{{"--workers", "11"}, {"--workers", "-1"}, {"--wait", "-1s"}} {
		_, errs, code := h.run("", false, append([]string{"cluster", "create", "x"}, bad...)...)
		if code == 0 || !strings.Contains(errs, bad[0]) || !strings.Contains(errs, "fix:") {
			t.Errorf("%v: %d %s", bad, code, errs)
		}
	}
	h.env.Kind.Images["example.com/app:dev"] = true
	if out, errs, code := h.run("", false, "cluster", "load", "dev", "example.com/app:dev"); code != 0 || !strings.Contains(out, "loaded example.com/app:dev into cluster dev") {
		t.Errorf("load: %s %s", out, errs)
	}
	if _, errs, code := h.run("", false, "cluster", "load", "dev", "nope:1"); code == 0 || !strings.Contains(errs, "not in the machine's Docker engine") {
		t.Errorf("load missing image: %s", errs)
	}
	if _, errs, code := h.run("", false, "cluster", "load", "ghost", "example.com/app:dev"); code == 0 || !strings.Contains(errs, "cluster not found: ghost") {
		t.Errorf("load into unknown cluster: %s", errs)
	}
	dir := filepath.Join(h.home, "bug")
	if out, errs, code := h.run("", false, "cluster", "logs", "dev", dir); code != 0 || !strings.Contains(out, dir) {
		t.Errorf("logs: %s %s", out, errs)
	}
	if _, err := os.Stat(filepath.Join(dir, "dev-control-plane", "kubelet.log")); err != nil {
		t.Errorf("logs not written: %v", err)
	}
	if out, errs, code := h.run("", false, "cluster", "stop", "dev"); code != 0 || !strings.Contains(out, "dev-worker2, dev-worker, dev-control-plane") {
		t.Errorf("stop: %s %s", out, errs)
	}
	if out, _, _ := h.run("", false, "cluster", "list"); !strings.Contains(out, "exited") {
		t.Errorf("list after stop:\n%s", out)
	}
	if out, errs, code := h.run("", false, "cluster", "start", "dev"); code != 0 || !strings.Contains(out, "cluster dev is running") {
		t.Errorf("start: %s %s", out, errs)
	}
	if _, errs, code := h.run("", false, "cluster", "start", "ghost"); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("start unknown: %s", errs)
	}
}
