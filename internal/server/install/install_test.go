package install

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/golden"
)

func goldenOptions() Options {
	return Options{
		DataDir:    "/var/lib/k3sm",
		ServerArgs: []string{"--secrets-encryption", "--node-name=mac-mini", "--tls-san=my host", "--cluster-domain=100%"},
		Version:    "v0.0.0-test",
	}
}

func renderUnits(t *testing.T, svc Service, o Options) []byte {
	t.Helper()
	units, err := svc.Units(o)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, u := range units {
		b.WriteString("# " + u.Path + "\n" + string(u.Content))
	}
	return []byte(b.String())
}

func renderLifecycle(svc Service, o Options) []byte {
	m := &Manifest{CreatedUser: true}
	return []byte("# setup\n" + RenderCommands(svc.Setup(o)) +
		"# start\n" + RenderCommands(svc.Start(o, false)) +
		"# start after a change\n" + RenderCommands(svc.Start(o, true)) +
		"# stop\n" + RenderCommands(svc.Stop(o)) +
		"# teardown\n" + RenderCommands(svc.Teardown(o, m)) +
		"# active\n" + RenderCommands([][]string{svc.ActiveCommand(o)}))
}

func TestSystemdGolden(t *testing.T) {
	o := goldenOptions()
	sd := Systemd{UID: 990, AddSubIDs: true}
	golden.Check(t, "k3sm.service", renderUnits(t, sd, o))
	golden.Check(t, "systemd-commands.txt", renderLifecycle(sd, o))
}

// An agent: `k3sm agent` in k3sm-agent.service beside the same netd unit,
// its join token only in the root-only environment file.
func agentGoldenOptions() Options {
	return Options{
		Role:        RoleAgent,
		DataDir:     "/var/lib/k3sm",
		ServerArgs:  []string{"--node-name=worker-1", "--server=https://192.0.2.10:9345"},
		Environment: []string{"K3SM_TOKEN=K10" + strings.Repeat("ab", 32) + "::abcdef.0123456789abcdef"},
		Version:     "v0.0.0-test",
	}
}

func TestSystemdAgentGolden(t *testing.T) {
	o := agentGoldenOptions()
	sd := Systemd{UID: 990, AddSubIDs: true}
	golden.Check(t, "k3sm-agent.service", renderUnits(t, sd, o))
	golden.Check(t, "systemd-agent-commands.txt", renderLifecycle(sd, o))
}

func TestLaunchdAgentGolden(t *testing.T) {
	o := agentGoldenOptions()
	l := Launchd{UID: 450}
	golden.Check(t, "launchd-agent.plists", renderUnits(t, l, o))
	// The agent's plist holds the join token: only root reads it.
	units, err := l.Units(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range units {
		if agent := u.Path == plistPath(o, LabelAgent); agent != (u.Mode == 0o600) {
			t.Errorf("%s: mode %o", u.Path, u.Mode)
		}
	}
	golden.Check(t, "launchd-agent-commands.txt", renderLifecycle(l, o))
}

func TestLaunchdGolden(t *testing.T) {
	o := goldenOptions()
	l := Launchd{UID: 450}
	golden.Check(t, "launchd.plists", renderUnits(t, l, o))
	golden.Check(t, "launchd-commands.txt", renderLifecycle(l, o))
	o.DataVolume = "k3sm-data"
	golden.Check(t, "launchd-datavol.plists", renderUnits(t, Launchd{UID: 450, UserExists: true}, o))
	golden.Check(t, "launchd-datavol-commands.txt", renderLifecycle(Launchd{UID: 450, UserExists: true}, o))
}

func TestSystemdQuote(t *testing.T) {
	for in, want := range map[string]string{
		"/usr/local/lib/k3sm/k3sm": "/usr/local/lib/k3sm/k3sm",
		"--tls-san=a b":            `"--tls-san=a b"`,
		`say "hi"\`:                `"say \"hi\"\\"`,
		"50%":                      "50%%",
		"$HOME":                    "$$HOME",
		"":                         `""`,
	} {
		if got, err := systemdQuote(in); err != nil || got != want {
			t.Errorf("systemdQuote(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := systemdQuote("a\nb"); err == nil {
		t.Error("a newline must be refused")
	}
}

// recorder is a Runner that records commands and succeeds.
type recorder struct{ cmds []string }

func (r *recorder) Run(_ context.Context, argv []string) (string, error) {
	r.cmds = append(r.cmds, strings.Join(argv, " "))
	return "", nil
}

const adminKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: k3sm
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: k3sm-admin
  user: {token: x}
contexts:
- name: k3sm
  context: {cluster: k3sm, user: k3sm-admin}
current-context: k3sm
`

const otherKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: other
  cluster: {server: "https://192.0.2.1:6443"}
users:
- name: other
  user: {token: y}
contexts:
- name: other
  context: {cluster: other, user: other}
current-context: other
`

// TestInstallUninstallFiles: install creates binaries, link, unit,
// manifest and kubeconfig context; a second install changes nothing and
// does not restart; a changed binary restarts; uninstall removes exactly
// what install made and keeps what was there before.
func TestInstallUninstallFiles(t *testing.T) {
	root := t.TempDir()
	src := sourceBinaries(t, root)
	data := filepath.Join(root, "data")
	os.MkdirAll(data, 0o700)
	os.WriteFile(filepath.Join(data, "admin.kubeconfig"), []byte(adminKubeconfig), 0o600)
	home := filepath.Join(root, "home")
	os.MkdirAll(filepath.Join(home, ".kube"), 0o700)
	kc := filepath.Join(home, ".kube", "config")
	os.WriteFile(kc, []byte(otherKubeconfig), 0o600)
	os.MkdirAll(filepath.Join(root, "usr/local/bin"), 0o755) // exists before: kept
	os.WriteFile(filepath.Join(root, "usr/local/bin/other"), nil, 0o755)

	rec := &recorder{}
	var out strings.Builder
	o := Options{
		DataDir: data, Source: src, Version: "test",
		LibDir: filepath.Join(root, "usr/local/lib/k3sm"), BinLink: filepath.Join(root, "usr/local/bin/k3sm"),
		UnitDir: filepath.Join(root, "etc/systemd/system"), ManifestPath: filepath.Join(root, "etc/k3sm/install.json"),
		Kubeconfig: kc, KubeconfigUID: os.Getuid(), GID: os.Getgid(),
		ServerArgs: []string{"--secrets-encryption"},
		Out:        &out, Runner: rec,
	}
	sd := Systemd{UID: 990, UserExists: true}
	if err := Install(context.Background(), sd, o); err != nil {
		t.Fatal(err)
	}
	if want := []string{"install -d -m 0700 -o k3sm -g k3sm " + data, "systemctl daemon-reload", "systemctl enable k3sm-netd.service k3sm.service",
		"systemctl restart k3sm-netd.service", "systemctl restart k3sm.service"}; !slices.Equal(rec.cmds, want) {
		t.Fatalf("commands %q, want %q", rec.cmds, want)
	}
	unit, err := os.ReadFile(filepath.Join(o.UnitDir, SystemdUnit))
	if err != nil || !strings.Contains(string(unit), "ExecStart="+o.LibDir+"/k3sm server --data-dir "+data+" --netd-socket /run/k3sm/netd.sock --secrets-encryption\n") {
		t.Fatalf("unit: %v\n%s", err, unit)
	}
	if target, err := os.Readlink(o.BinLink); err != nil || target != filepath.Join(o.LibDir, "k3sm") {
		t.Fatalf("link: %q %v", target, err)
	}
	for _, b := range Binaries {
		if fi, err := os.Stat(filepath.Join(o.LibDir, b)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Fatalf("%s: %v", b, err)
		}
	}
	cfg, _ := os.ReadFile(kc)
	if !strings.Contains(string(cfg), "name: other") || !strings.Contains(string(cfg), "current-context: k3sm") {
		t.Fatalf("kubeconfig after install:\n%s", cfg)
	}

	// Again: nothing changed, so start (not restart).
	rec.cmds = nil
	if err := Install(context.Background(), sd, o); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rec.cmds, "systemctl start k3sm.service") {
		t.Fatalf("second install ran %q, want a plain start", rec.cmds)
	}
	m, err := ReadManifest(o.ManifestPath)
	if err != nil || len(m.Kubeconfigs) != 1 || m.Kubeconfigs[0].Created || !slices.Equal(m.Kubeconfigs[0].Contexts, []string{"k3sm"}) {
		t.Fatalf("manifest %+v %v", m, err)
	}
	// A new binary: restart.
	os.WriteFile(filepath.Join(src, "k3sm-shim"), []byte("new"), 0o755)
	rec.cmds = nil
	if err := Install(context.Background(), sd, o); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rec.cmds, "systemctl restart k3sm.service") {
		t.Fatalf("install after a binary changed ran %q, want a restart", rec.cmds)
	}
	// Another data dir is refused while installed.
	o2 := o
	o2.DataDir = filepath.Join(root, "elsewhere")
	if err := Install(context.Background(), sd, o2); err == nil || !strings.Contains(err.Error(), "--data-dir "+data) {
		t.Fatalf("install with another data dir: %v", err)
	}

	// netd ran: uninstall has the installed k3sm-netd remove the pod
	// network once the service is stopped, with its own configuration.
	netdState := filepath.Join(filepath.Dir(o.ManifestPath), "netd-state", "state.json")
	os.MkdirAll(filepath.Dir(netdState), 0o700)
	os.WriteFile(netdState, []byte("{}"), 0o600)
	rec.cmds = nil
	if err := Uninstall(context.Background(), sd, o, UninstallOptions{}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rec.cmds, "systemctl stop k3sm.service") || !slices.Contains(rec.cmds, "systemctl disable k3sm.service k3sm-netd.service") {
		t.Fatalf("uninstall ran %q", rec.cmds)
	}
	stop := slices.Index(rec.cmds, "systemctl stop k3sm.service")
	remove := slices.IndexFunc(rec.cmds, func(c string) bool {
		return c == filepath.Join(o.LibDir, "k3sm-netd")+" remove --config="+filepath.Join(filepath.Dir(o.ManifestPath), "netd.json")
	})
	if remove < stop {
		t.Fatalf("uninstall did not remove the pod network after stopping the service: %q", rec.cmds)
	}
	if _, err := os.Stat(netdState); !os.IsNotExist(err) {
		t.Errorf("netd's state is left: %v", err)
	}
	for _, gone := range []string{o.LibDir, o.BinLink, filepath.Join(root, "etc"), filepath.Join(root, "usr/local/lib")} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("%s still there after uninstall (%v)", gone, err)
		}
	}
	for _, kept := range []string{filepath.Join(root, "usr/local/bin/other"), filepath.Join(data, "admin.kubeconfig")} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s was not install's but is gone: %v", kept, err)
		}
	}
	cfg, _ = os.ReadFile(kc)
	if strings.Contains(string(cfg), "k3sm") || !strings.Contains(string(cfg), "name: other") {
		t.Fatalf("kubeconfig after uninstall:\n%s", cfg)
	}
	if err := Uninstall(context.Background(), sd, o, UninstallOptions{}); err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("second uninstall: %v", err)
	}

	// Purge: the data dir goes too; a kubeconfig install created goes when empty.
	os.RemoveAll(filepath.Join(home, ".kube"))
	if err := Install(context.Background(), sd, o); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(context.Background(), sd, o, UninstallOptions{Purge: true}); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{data, filepath.Join(home, ".kube")} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("%s still there after uninstall --purge (%v)", gone, err)
		}
	}
}

// sourceBinaries makes <root>/src holding a small script for each of
// Binaries: what install copies.
func sourceBinaries(t *testing.T, root string) string {
	t.Helper()
	src := filepath.Join(root, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range Binaries {
		if err := os.WriteFile(filepath.Join(src, b), []byte("#!/bin/sh\necho "+b+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

func TestInstallRefusesForeignBinLink(t *testing.T) {
	root := t.TempDir()
	src := sourceBinaries(t, root)
	os.MkdirAll(filepath.Join(root, "bin"), 0o755)
	os.WriteFile(filepath.Join(root, "bin/k3sm"), []byte("someone else's"), 0o755)
	var out strings.Builder
	o := Options{DataDir: filepath.Join(root, "data"), Source: src, LibDir: filepath.Join(root, "lib"), BinLink: filepath.Join(root, "bin/k3sm"),
		UnitDir: filepath.Join(root, "units"), ManifestPath: filepath.Join(root, "etc/install.json"), Out: &out, Runner: &recorder{}}
	err := Install(context.Background(), Systemd{}, o)
	if err == nil || !strings.Contains(err.Error(), "--bin-link=false") {
		t.Fatalf("install over a foreign %s: %v", o.BinLink, err)
	}
	// What it made so far is recorded, so uninstall cleans it up.
	if err := Uninstall(context.Background(), Systemd{}, o, UninstallOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(o.BinLink); string(b) != "someone else's" {
		t.Fatal("uninstall touched a file install did not make")
	}
	if _, err := os.Stat(o.LibDir); !os.IsNotExist(err) {
		t.Fatalf("lib dir left: %v", err)
	}
}

// TestSecretsOutOfTheUnit: Options.Environment (the datastore endpoint
// with its password) reaches the server through a file only root reads,
// never through the world-readable unit.
func TestSecretsOutOfTheUnit(t *testing.T) {
	o := goldenOptions()
	const secret = `postgres://k3sm:pa$s"w\rd@db:5432/k3sm`
	o.Environment = []string{"K3SM_DATASTORE_ENDPOINT=" + secret}
	sd := Systemd{UID: 990}
	units, err := sd.Units(o)
	if err != nil {
		t.Fatal(err)
	}
	var env, unit *File
	for i := range units {
		switch units[i].Path {
		case sd.EnvPath(o):
			env = &units[i]
		case sd.UnitPath(o):
			unit = &units[i]
		}
	}
	if env == nil || unit == nil {
		t.Fatalf("units %v: want the unit and its environment file", units)
	}
	if env.Mode != 0o600 || string(env.Content) != `K3SM_DATASTORE_ENDPOINT="postgres://k3sm:pa\$s\"w\\rd@db:5432/k3sm"`+"\n" {
		t.Errorf("environment file %o %q", env.Mode, env.Content)
	}
	if !strings.Contains(string(unit.Content), "\nEnvironmentFile="+sd.EnvPath(o)+"\n") || strings.Contains(string(unit.Content), "pa$s") {
		t.Errorf("unit:\n%s", unit.Content)
	}

	l := Launchd{UID: 450}
	plists, err := l.Units(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plists {
		holds := strings.Contains(string(p.Content), "<key>K3SM_DATASTORE_ENDPOINT</key>")
		if server := p.Path == plistPath(o, LabelServer); holds != server || (server && p.Mode != 0o600) || (!server && p.Mode != 0o644) {
			t.Errorf("%s: mode %o, holds the secret %v", p.Path, p.Mode, holds)
		}
	}
}

// An agent's install: its unit and token file, the manifest's role, a
// server install refused over it, and an uninstall (given no role: the
// manifest says) that stops the agent's unit.
func TestInstallUninstallAgent(t *testing.T) {
	root := t.TempDir()
	src := sourceBinaries(t, root)
	data := filepath.Join(root, "data")
	rec := &recorder{}
	o := Options{Role: RoleAgent, NodeName: "worker-1", DataDir: data, Source: src, Version: "test", NoBinLink: true,
		LibDir: filepath.Join(root, "lib"), UnitDir: filepath.Join(root, "units"), ManifestPath: filepath.Join(root, "etc/install.json"),
		ServerArgs: []string{"--server=https://192.0.2.10:9345"}, Environment: []string{"K3SM_TOKEN=secret-token"},
		Out: &strings.Builder{}, Runner: rec}
	sd := Systemd{UID: 990, UserExists: true}
	if err := Install(context.Background(), sd, o); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rec.cmds, "systemctl restart k3sm-agent.service") || slices.ContainsFunc(rec.cmds, func(c string) bool { return strings.Contains(c, "k3sm.service") }) {
		t.Fatalf("agent install ran %q", rec.cmds)
	}
	unit, _ := os.ReadFile(filepath.Join(o.UnitDir, SystemdAgentUnit))
	if !strings.Contains(string(unit), " agent --data-dir "+data+" --netd-socket /run/k3sm/netd.sock --server=https://192.0.2.10:9345\n") || strings.Contains(string(unit), "secret-token") {
		t.Fatalf("agent unit:\n%s", unit)
	}
	if fi, err := os.Stat(filepath.Join(o.UnitDir, SystemdAgentUnit+".env")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v", err)
	}
	if m, err := ReadManifest(o.ManifestPath); err != nil || m.Role != RoleAgent {
		t.Fatalf("manifest %+v %v", m, err)
	}
	srv := o
	srv.Role = ""
	if err := Install(context.Background(), sd, srv); err == nil || !strings.Contains(err.Error(), "installed k3sm agent") {
		t.Fatalf("a server installed over an agent: %v", err)
	}
	rec.cmds = nil
	if err := Uninstall(context.Background(), sd, Options{ManifestPath: o.ManifestPath, UnitDir: o.UnitDir, LibDir: o.LibDir, Out: &strings.Builder{}, Runner: rec}, UninstallOptions{}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rec.cmds, "systemctl stop k3sm-agent.service") || slices.Contains(rec.cmds, "systemctl stop k3sm.service") {
		t.Fatalf("uninstall of an agent ran %q", rec.cmds)
	}
	if _, err := os.Stat(filepath.Join(o.UnitDir, SystemdAgentUnit+".env")); !os.IsNotExist(err) {
		t.Fatalf("the token file outlived uninstall: %v", err)
	}
}
