package deploy

import (
	"context"
	"encoding/base64"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/charttest"
	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmwire"
)

var (
	helperOnce sync.Once
	helperBin  string
	helperErr  error
)

// builtHelper builds the real k3sm-helm once for the package's tests.
func builtHelper(t *testing.T) string {
	t.Helper()
	helperOnce.Do(func() {
		dir, err := os.MkdirTemp("", "k3sm-helm-test")
		if err != nil {
			helperErr = err
			return
		}
		helperBin = filepath.Join(dir, HelperBinary)
		out, err := exec.Command("go", "build", "-o", helperBin, "github.com/k3sm-dev/k3sm/cmd/k3sm-helm").CombinedOutput()
		if err != nil {
			helperErr = err
			t.Logf("%s", out)
		}
	})
	if helperErr != nil {
		t.Fatalf("building k3sm-helm: %v", helperErr)
	}
	return helperBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if helperBin != "" {
		os.RemoveAll(filepath.Dir(helperBin))
	}
	os.Exit(code)
}

// deadKubeconfig points at a loopback port nothing listens on.
func deadKubeconfig(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://" + addr + "', insecure-skip-tls-verify: true}}]\n" +
		"users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func wantFailure(t *testing.T, err error, reasonWant string, parts ...string) {
	t.Helper()
	t.Logf("error: %v", err)
	if err == nil {
		t.Fatalf("no error, want %s", reasonWant)
	}
	if got := reason(err, "InstallFailed"); got != reasonWant {
		t.Errorf("reason %s, want %s", got, reasonWant)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not say %q", err, p)
		}
	}
}

// Without k3sm-helm beside k3sm, a HelmChart fails naming the file and
// how to build it.
func TestHelperMissing(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "k3sm")
	c := &Charts{Exe: exe, Kubeconfig: "/nonexistent", Log: slog.New(slog.DiscardHandler)}
	_, err := c.helm(context.Background(), &helmwire.Request{Op: helmwire.OpUninstall, Release: "x", Namespace: "default"})
	wantFailure(t, err, "HelperFailed", filepath.Join(filepath.Dir(exe), "k3sm-helm")+" not found", "make bin/k3sm-helm", "--disable-helm-controller")
}

// Requests through the real k3sm-helm: each failing step comes back as the
// status reason the in-process controller gave it, with helm's message;
// the chart and spec.set get there intact.
func TestHelperStages(t *testing.T) {
	c := &Charts{Exe: filepath.Join(filepath.Dir(builtHelper(t)), "k3sm"), Kubeconfig: deadKubeconfig(t), Log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	deploy := func(content string, set helmwire.Values) error {
		_, err := c.helm(ctx, &helmwire.Request{Op: helmwire.OpDeploy, Release: "app", Namespace: "default",
			ChartContent: content, Set: set, Values: helmwire.Values{"greeting": "hi"}, Timeout: time.Minute})
		return err
	}
	tgz := base64.StdEncoding.EncodeToString(charttest.Chart(t, "app", "0.1.0"))

	wantFailure(t, deploy("not base64!", nil), "ChartNotLoaded", "spec.chartContent is not base64")
	wantFailure(t, deploy(base64.StdEncoding.EncodeToString([]byte("not a tgz")), nil), "ChartNotLoaded", "spec.chartContent:")
	wantFailure(t, deploy(tgz, helmwire.Values{"a[=": int64(1)}), "InvalidValues", "spec.set.a[=")
	// Values and chart were read: it fails only on reaching the cluster.
	wantFailure(t, deploy(tgz, helmwire.Values{"greeting": "set"}), "InstallFailed", "connection refused")
	_, err := c.helm(ctx, &helmwire.Request{Op: helmwire.OpUninstall, Release: "app", Namespace: "default"})
	wantFailure(t, err, "UninstallFailed", "connection refused")
	_, err = c.helm(ctx, &helmwire.Request{Op: helmwire.OpRelease, Release: "app", Namespace: "default"})
	if stageOf(err) != helmwire.StageRelease {
		t.Errorf("reading the release of an unreachable cluster: %v, want a failure of stage release (the controller then deploys)", err)
	}

	c.Kubeconfig = filepath.Join(t.TempDir(), "absent.kubeconfig")
	wantFailure(t, deploy(tgz, nil), "HelperFailed", "k3sm-helm: kubeconfig "+c.Kubeconfig)
}
