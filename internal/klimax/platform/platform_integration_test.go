package platform_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker/dockertest"
	"github.com/k3sm-dev/k3sm/internal/klimax/platform"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// TestIntegrationHostUpDownDestroy drives the host driver against the real
// engine: up creates the network and a mirror, the mirror serves an image
// pulled through it from an upstream registry, up again changes nothing,
// down/up keeps the cache (the upstream is gone by then), destroy removes
// everything klimax made. The test only talks to 127.0.0.1 (published
// ports); containers talk to each other on the test's own bridge.
func TestIntegrationHostUpDownDestroy(t *testing.T) {
	dc := dockertest.Engine(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	prefix := dockertest.UniqueName("klimax-it")
	netName := prefix + "-kind"
	mirrorName := prefix + "-mirror"
	upstreamName := prefix + "-upstream"
	image := "klimax-test-registry:" + prefix
	dockertest.RegistryImage(t, dc, image)
	cidr := dockertest.FreeBridgeCIDR(t, dc)
	mirrorPort := dockertest.FreePort(t)
	upstreamPort := dockertest.FreePort(t)
	for mirrorPort == upstreamPort {
		upstreamPort = dockertest.FreePort(t)
	}
	t.Cleanup(func() {
		bg := context.Background()
		for _, n := range []string{mirrorName, upstreamName} {
			dc.API().ContainerRemove(bg, n, client.ContainerRemoveOptions{Force: true})
		}
		dc.API().NetworkRemove(bg, netName, client.NetworkRemoveOptions{})
	})

	cfg := config.Default()
	cfg.VM.Driver = config.DriverHost
	cfg.VM.Name = "klimax-it"
	cfg.Network.KindBridgeCIDR = cidr.String()
	cfg.Registries.Mirrors = []config.Mirror{{Name: mirrorName, Port: mirrorPort, RemoteURL: "http://" + upstreamName + ":5000"}}
	home := t.TempDir()
	dockerCfg := t.TempDir()
	p, err := platform.New(cfg, platform.Options{Home: home, NetworkName: netName, MirrorImage: image, DockerConfigDir: dockerCfg})
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	progress := func(step string) func(error) {
		steps = append(steps, step)
		return func(err error) {
			if err != nil {
				t.Logf("step %q failed: %v", step, err)
			}
		}
	}

	// Before up, cluster create must be refused (kind would make the
	// network itself, on a random subnet).
	if err := p.NetworkReady(ctx); err == nil || !strings.Contains(err.Error(), "run `klimax up` first") {
		t.Fatalf("NetworkReady before up: %v", err)
	}

	// --- up ---------------------------------------------------------------
	if err := p.Up(ctx, progress); err != nil {
		t.Fatalf("up: %v", err)
	}
	if err := p.NetworkReady(ctx); err != nil {
		t.Fatalf("NetworkReady after up: %v", err)
	}
	t.Logf("up steps: %q", steps)
	info, err := dc.InspectNetwork(ctx, netName)
	if err != nil || info == nil || len(info.Subnets) != 1 || info.Subnets[0] != cidr || info.Gateways[0] != cidr.Addr().Next() {
		t.Fatalf("network after up: %+v, %v", info, err)
	}
	mirror := inspect(t, dc, mirrorName)
	if !mirror.State.Running || mirror.Config.Labels[docker.LabelManagedBy] != docker.ManagedBy {
		t.Fatalf("mirror after up: running=%v labels=%v", mirror.State.Running, mirror.Config.Labels)
	}
	if _, ok := mirror.NetworkSettings.Networks[netName]; !ok {
		t.Fatalf("mirror is not on %s: %v", netName, mirror.NetworkSettings.Networks)
	}
	// kind cannot create clusters here; doctor only asks its version.
	kindDir := t.TempDir()
	os.WriteFile(filepath.Join(kindDir, "kind"), []byte("#!/bin/sh\necho kind v0.32.0 go1.25.5 linux/amd64\n"), 0o755)
	t.Setenv("PATH", kindDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, c := range p.Doctor(ctx) {
		if c.Status != platform.Pass {
			t.Errorf("doctor after up: %+v", c)
		}
	}

	// --- up again: nothing changes ------------------------------------------
	netID, mirrorID, started := info.ID, mirror.ID, mirror.State.StartedAt
	if err := p.Up(ctx, nil); err != nil {
		t.Fatalf("second up: %v", err)
	}
	info2, _ := dc.InspectNetwork(ctx, netName)
	mirror2 := inspect(t, dc, mirrorName)
	if info2.ID != netID || mirror2.ID != mirrorID || mirror2.State.StartedAt != started {
		t.Fatalf("second up changed something: network %s->%s, mirror %s->%s, started %s->%s",
			netID, info2.ID, mirrorID, mirror2.ID, started, mirror2.State.StartedAt)
	}

	// --- upstream registry, reachable from the mirror by name -------------
	startUpstream(t, dc, image, upstreamName, netName, upstreamPort)
	waitRegistry(t, upstreamPort)
	img, err := random.Image(64<<10, 3)
	if err != nil {
		t.Fatal(err)
	}
	upRef, _ := name.ParseReference(fmt.Sprintf("127.0.0.1:%d/team/app:v1", upstreamPort), name.Insecure)
	if err := remote.Write(upRef, img, remote.WithContext(ctx)); err != nil {
		t.Fatalf("push to upstream: %v", err)
	}
	want, _ := img.Digest()

	// --- pull through the mirror --------------------------------------------
	waitRegistry(t, mirrorPort)
	pulled := pull(t, ctx, fmt.Sprintf("127.0.0.1:%d/team/app:v1", mirrorPort))
	if got, _ := pulled.Digest(); got != want {
		t.Fatalf("mirror served digest %s, upstream has %s", got, want)
	}
	blobs, _ := filepath.Glob(filepath.Join(home, "registry-cache", mirrorName, "blobs", "*"))
	if len(blobs) < 5 { // manifest, config, 3 layers
		t.Fatalf("cache on the host holds %d blobs, want >= 5", len(blobs))
	}

	// --- down, upstream gone, up: served from the kept cache ---------------
	if err := p.Down(ctx, false); err != nil {
		t.Fatalf("down: %v", err)
	}
	if m := inspect(t, dc, mirrorName); m.State.Running {
		t.Fatal("mirror still runs after down")
	}
	if n, _ := dc.InspectNetwork(ctx, netName); n == nil {
		t.Fatal("down removed the network")
	}
	failed := false
	for _, c := range p.Doctor(ctx) {
		if c.Name == "mirror "+mirrorName && c.Status == platform.Fail {
			failed = true
		}
	}
	if !failed {
		t.Error("doctor does not report the stopped mirror as FAIL")
	}
	if _, err := dc.API().ContainerRemove(ctx, upstreamName, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if err := p.Up(ctx, nil); err != nil {
		t.Fatalf("up after down: %v", err)
	}
	waitRegistry(t, mirrorPort)
	again := pull(t, ctx, fmt.Sprintf("127.0.0.1:%d/team/app@%s", mirrorPort, want))
	if got, _ := again.Digest(); got != want {
		t.Fatalf("after down/up the mirror served %s, want %s", got, want)
	}

	// --- docker context, then destroy ----------------------------------------
	if _, err := p.DockerContext(ctx, false); err != nil {
		t.Fatal(err)
	}
	store := docker.ContextStore{Dir: dockerCfg}
	if h, _ := store.Get("klimax-it"); h == "" {
		t.Fatal("docker context was not written")
	}
	if err := p.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if _, err := dc.API().ContainerInspect(ctx, mirrorName, client.ContainerInspectOptions{}); err == nil {
		t.Error("mirror container survives destroy")
	}
	if n, _ := dc.InspectNetwork(ctx, netName); n != nil {
		t.Error("network survives destroy")
	}
	if h, _ := store.Get("klimax-it"); h != "" {
		t.Error("docker context survives destroy")
	}
	if cur, _ := store.Current(); cur != "" {
		t.Errorf("current docker context after destroy = %q", cur)
	}
	if _, err := os.Stat(filepath.Join(home, "registry-cache", mirrorName)); err != nil {
		t.Errorf("destroy removed the registry cache (it keeps it by design): %v", err)
	}
	if err := p.Destroy(ctx); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
}

func inspect(t *testing.T, dc *docker.Client, name string) container.InspectResponse {
	t.Helper()
	res, err := dc.API().ContainerInspect(context.Background(), name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Container
}

func startUpstream(t *testing.T, dc *docker.Client, image, name, netName string, port int) {
	t.Helper()
	ctx := context.Background()
	p := network.MustParsePort("5000/tcp")
	_, err := dc.API().ContainerCreate(ctx, client.ContainerCreateOptions{
		Name:   name,
		Config: &container.Config{Image: image, ExposedPorts: network.PortSet{p: {}}},
		HostConfig: &container.HostConfig{
			NetworkMode:  container.NetworkMode(netName),
			PortBindings: network.PortMap{p: {{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(port)}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dc.API().ContainerStart(ctx, name, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitRegistry polls http://127.0.0.1:port/v2/ until it answers 200.
func waitRegistry(t *testing.T, port int) {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d/v2/", port)
	hc := &http.Client{Timeout: 2 * time.Second}
	poll.Every(t, context.Background(), 30*time.Second, 200*time.Millisecond, "the registry on 127.0.0.1:"+strconv.Itoa(port), func() error {
		resp, err := hc.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	})
}

// pull fetches ref and every blob of it, verifying digests.
func pull(t *testing.T, ctx context.Context, ref string) v1.Image {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r, remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	if err := validate.Image(img); err != nil {
		t.Fatalf("pulled %s is not intact: %v", ref, err)
	}
	return img
}

// A mirror removed from the config is removed by the next up (its cache
// is kept); before, it ran forever. A mirror whose port is taken fails up
// with the port and the fix, and leaves no container.
func TestIntegrationUpReconcilesMirrors(t *testing.T) {
	dc := dockertest.Engine(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prefix := dockertest.UniqueName("klimax-rc")
	netName := prefix + "-kind"
	keep, drop, busy := prefix+"-keep", prefix+"-drop", prefix+"-busy"
	image := "klimax-test-registry:" + prefix
	dockertest.RegistryImage(t, dc, image)
	cidr := dockertest.FreeBridgeCIDR(t, dc)
	t.Cleanup(func() {
		bg := context.Background()
		for _, n := range []string{keep, drop, busy} {
			dc.API().ContainerRemove(bg, n, client.ContainerRemoveOptions{Force: true})
		}
		dc.API().NetworkRemove(bg, netName, client.NetworkRemoveOptions{})
	})
	home := t.TempDir()
	newPlat := func(mirrors ...config.Mirror) *platform.Platform {
		cfg := config.Default()
		cfg.VM.Driver = config.DriverHost
		cfg.VM.Name = "klimax-rc"
		cfg.Network.KindBridgeCIDR = cidr.String()
		cfg.Registries.Mirrors = mirrors
		p, err := platform.New(cfg, platform.Options{Home: home, NetworkName: netName, MirrorImage: image, DockerConfigDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	mk, md := config.Mirror{Name: keep, Port: dockertest.FreePort(t), RemoteURL: "http://up1:5000"}, config.Mirror{Name: drop, Port: dockertest.FreePort(t), RemoteURL: "http://up2:5000"}
	if err := newPlat(mk, md).Up(ctx, nil); err != nil {
		t.Fatal(err)
	}
	keepID := inspect(t, dc, keep).ID
	var steps []string
	progress := func(s string) func(error) { steps = append(steps, s); return func(error) {} }
	if err := newPlat(mk).Up(ctx, progress); err != nil {
		t.Fatal(err)
	}
	if _, err := dc.API().ContainerInspect(ctx, drop, client.ContainerInspectOptions{}); err == nil {
		t.Errorf("mirror %s removed from the config still exists after up (steps %q)", drop, steps)
	}
	if got := inspect(t, dc, keep); got.ID != keepID || !got.State.Running {
		t.Error("the configured mirror was touched")
	}
	if _, err := os.Stat(filepath.Join(home, "registry-cache", drop)); err != nil {
		t.Errorf("the removed mirror's cache was deleted: %v", err)
	}
	// Port taken by something else.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	err = newPlat(mk, config.Mirror{Name: busy, Port: port, RemoteURL: "http://up3:5000"}).Up(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "port 127.0.0.1:"+strconv.Itoa(port)+" is already in use") || !strings.Contains(err.Error(), "registries.mirrors") {
		t.Errorf("up with a taken mirror port: %v", err)
	}
	if _, err := dc.API().ContainerInspect(ctx, busy, client.ContainerInspectOptions{}); err == nil {
		t.Error("a mirror container was left behind for the taken port")
	}
}
