package platform

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

func TestNewLimaWiring(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	cfg := config.Default()
	cfg.VM.Driver = config.DriverLima
	p, err := New(cfg, Options{Home: filepath.Join(home, ".klimax"), DockerConfigDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	l, ok := p.Driver().(*vm.Lima)
	if !ok {
		t.Fatalf("driver = %T", p.Driver())
	}
	sock := filepath.Join(home, ".klimax.docker.sock")
	if l.Spec.DockerSocket != sock || l.Spec.CacheDir != filepath.Join(home, ".klimax", "registry-cache") {
		t.Fatalf("spec = %+v", l.Spec)
	}
	if !strings.Contains(l.Spec.ProvisionScript, "net.ipv4.ip_forward = 1") {
		t.Fatal("provision script not wired into the Lima spec")
	}
	if got := p.DockerEnv(false); got != "export DOCKER_HOST=unix://"+sock+"\n" {
		t.Fatalf("docker-env = %q", got)
	}
	if got := p.DockerEnv(true); got != "unset DOCKER_HOST\n" {
		t.Fatalf("docker-env --unset = %q", got)
	}
	if !p.Driver().NeedsRoute() {
		t.Fatal("lima must need the route")
	}
	msg, err := p.DockerContext(context.Background(), false)
	if err != nil || !strings.Contains(msg, sock) {
		t.Fatalf("docker-context: %q %v", msg, err)
	}

	cfg.Registries.CacheStorage = config.CacheGuest
	p, err = New(cfg, Options{Home: filepath.Join(home, ".klimax")})
	if err != nil {
		t.Fatal(err)
	}
	if l := p.Driver().(*vm.Lima); l.Spec.CacheDir != "" || !strings.Contains(l.Spec.ProvisionScript, "/var/lib/klimax/registry-cache") {
		t.Fatalf("guest cache storage: mount %q", l.Spec.CacheDir)
	}
}

func TestNewRefusesInvalidConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Network.KindBridgeCIDR = "172.30.0.1/16; reboot"
	if _, err := New(cfg, Options{Home: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "kindBridgeCIDR") {
		t.Fatalf("err = %v", err)
	}
	cfg = config.Default()
	cfg.VM.Driver = "qemu"
	if _, err := New(cfg, Options{Home: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "vm.driver") {
		t.Fatalf("err = %v", err)
	}
}

// TestHostUpWithoutEngineFailsFast: with the host driver and no engine, up
// fails within seconds (was 2 minutes) and says how to start one.
func TestHostUpWithoutEngineFailsFast(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(home, "no-engine.sock"))
	cfg := config.Default()
	cfg.VM.Driver = config.DriverHost
	p, err := New(cfg, Options{Home: filepath.Join(home, ".klimax"), DockerConfigDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = p.Up(context.Background(), nil)
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("up took %s without an engine", took)
	}
	if err == nil || !strings.Contains(err.Error(), "no Docker engine answers") || !strings.Contains(err.Error(), "start the local Docker engine") {
		t.Fatalf("err = %v, want one saying no engine answers and how to start one", err)
	}
}

// TestMirrorImageFromConfig: registries.mirrorImage is the image the
// mirrors run; without it, the pinned default.
func TestMirrorImageFromConfig(t *testing.T) {
	cfg := config.Default()
	cfg.VM.Driver = config.DriverHost
	p, err := New(cfg, Options{Home: t.TempDir(), DockerConfigDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.mirrorSpec(cfg.Registries.Mirrors[0]).Image; got != docker.DefaultMirrorImage {
		t.Errorf("default mirror image %q", got)
	}
	cfg.Registries.MirrorImage = "localhost:5000/registry:3.0.0"
	p, err = New(cfg, Options{Home: t.TempDir(), DockerConfigDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.mirrorSpec(cfg.Registries.Mirrors[0]).Image; got != "localhost:5000/registry:3.0.0" {
		t.Errorf("mirror image %q, want the configured one", got)
	}
}
