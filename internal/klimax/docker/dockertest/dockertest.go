// Package dockertest holds helpers for klimax's Docker integration tests:
// skipping without an engine, building the test registry image from
// ../testregistry (no image can be pulled here), free loopback ports and a
// bridge CIDR that clashes with nothing on this machine.
package dockertest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/k3sm-dev/k3sm/internal/klimax/docker"
)

// Engine returns a client for the default engine, or skips the test with
// the reason when none answers (run hack/start-docker.sh as root).
func Engine(t testing.TB) *docker.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test skipped under -short")
	}
	c, err := docker.New("")
	if err != nil {
		t.Skipf("no Docker client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Ping(ctx); err != nil {
		c.Close()
		t.Skipf("no Docker engine answers (start one with hack/start-docker.sh): %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
)

// registryBinary compiles ../testregistry statically, once per test binary.
func registryBinary() (string, error) {
	buildOnce.Do(func() {
		_, self, _, _ := runtime.Caller(0)
		src := filepath.Join(filepath.Dir(self), "..", "testregistry")
		dir, err := os.MkdirTemp("", "klimax-testregistry-")
		if err != nil {
			buildErr = err
			return
		}
		buildBin = filepath.Join(dir, "registry")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", buildBin, ".")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build test registry: %v\n%s", err, out)
		}
	})
	return buildBin, buildErr
}

// RegistryImage builds the test registry image, loads it into the engine
// with ImageLoad under ref, and removes it when the test ends.
func RegistryImage(t testing.TB, c *docker.Client, ref string) {
	t.Helper()
	bin, err := registryBinary()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	for _, d := range []string{"var/", "var/lib/", "var/lib/registry/", "tmp/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	tw.WriteHeader(&tar.Header{Name: "registry", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data))})
	tw.Write(data)
	tw.Close()
	layer, err := tarball.LayerFromReader(bytes.NewReader(layerTar.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Entrypoint: []string{"/registry"}, ExposedPorts: map[string]struct{}{"5000/tcp": {}}})
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.ConfigFile(img, mustConfigFile(t, img))
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.LoadImage(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.API().ImageRemove(context.Background(), ref, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	})
}

func mustConfigFile(t testing.TB, img v1.Image) *v1.ConfigFile {
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	return cf
}

// FreePort returns a TCP port that is free on 127.0.0.1 right now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// FreeBridgeCIDR returns a /16 in 172.16.0.0/12 that overlaps no Docker
// network and no route of this machine (only addresses are compared; no
// traffic is sent anywhere).
func FreeBridgeCIDR(t testing.TB, c *docker.Client) netip.Prefix {
	t.Helper()
	return freeBridgeCIDR(t, c, false)
}

// FreeBridgeCIDRLow is FreeBridgeCIDR searching from the low end (just above
// what Docker allocates first), so a test running in parallel with one that
// uses FreeBridgeCIDR does not pick the same /16.
func FreeBridgeCIDRLow(t testing.TB, c *docker.Client) netip.Prefix {
	t.Helper()
	return freeBridgeCIDR(t, c, true)
}

func freeBridgeCIDR(t testing.TB, c *docker.Client, low bool) netip.Prefix {
	t.Helper()
	var used []netip.Prefix
	res, err := c.API().NetworkList(context.Background(), client.NetworkListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range res.Items {
		for _, cfg := range n.IPAM.Config {
			if cfg.Subnet.IsValid() {
				used = append(used, cfg.Subnet)
			}
		}
	}
	if out, err := exec.Command("ip", "-j", "-4", "route", "show").Output(); err == nil {
		var routes []struct{ Dst string }
		json.Unmarshal(out, &routes)
		for _, r := range routes {
			if p, err := netip.ParsePrefix(r.Dst); err == nil && p.Bits() > 0 {
				used = append(used, p)
			}
		}
	}
	for i := 0; i < 14; i++ { // high end first: Docker allocates from the low end
		b := 31 - i
		if low {
			b = 22 + i%10 // 172.22-31, leaving 172.17-21 to Docker's own allocations
		}
		p := netip.MustParsePrefix(fmt.Sprintf("172.%d.0.0/16", b))
		free := true
		for _, u := range used {
			if u.Overlaps(p) {
				free = false
				break
			}
		}
		if free {
			return p
		}
	}
	t.Skip("no free 172.x.0.0/16 for a test bridge")
	return netip.Prefix{}
}

// UniqueName returns a name for test objects: prefix plus time and pid.
func UniqueName(prefix string) string {
	return strings.ToLower(fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), time.Now().UnixNano()%1e6))
}

// KindNode runs a container labelled like a kind node of cluster (kind's
// io.x-k8s.kind.* labels), publishing 6443 on 127.0.0.1:apiPort when
// apiPort is not 0; image is a long-running image (RegistryImage). It is
// removed when the test ends.
func KindNode(t testing.TB, c *docker.Client, image, cluster, role, name string, apiPort int) {
	t.Helper()
	if err := kindNode(t, c, image, cluster, role, name, apiPort); err != nil {
		t.Fatal(err)
	}
}

func kindNode(t testing.TB, c *docker.Client, image, cluster, role, name string, apiPort int) error {
	ctx := context.Background()
	cfg := &container.Config{Image: image, Labels: map[string]string{"io.x-k8s.kind.cluster": cluster, "io.x-k8s.kind.role": role}}
	hc := &container.HostConfig{}
	if apiPort != 0 {
		p := network.MustParsePort("6443/tcp")
		cfg.ExposedPorts = network.PortSet{p: struct{}{}}
		hc.PortBindings = network.PortMap{p: {{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(apiPort)}}}
	}
	if _, err := c.API().ContainerCreate(ctx, client.ContainerCreateOptions{Name: name, Config: cfg, HostConfig: hc}); err != nil {
		return err
	}
	t.Cleanup(func() {
		c.API().ContainerRemove(context.Background(), name, client.ContainerRemoveOptions{Force: true})
	})
	if _, err := c.API().ContainerStart(ctx, name, client.ContainerStartOptions{}); err != nil {
		c.API().ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true})
		return err
	}
	return nil
}

// KindControlPlaneOnSlotPort runs a kind-labelled control-plane container
// publishing 6443 on a free klimax slot port (7051-7099, the high end, so a
// developer's real clusters in the low slots are not in the way) and
// returns the port. Ports are tried in random order and a port another
// test process took between the check and the bind is skipped, so test
// packages running at once do not collide. It skips the test when no slot
// port is free.
func KindControlPlaneOnSlotPort(t testing.TB, c *docker.Client, image, cluster, name string) int {
	t.Helper()
	ports := rand.Perm(49)
	for _, i := range ports {
		p := 7051 + i
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l.Close()
		err = kindNode(t, c, image, cluster, "control-plane", name, p)
		if err == nil {
			return p
		}
		if !strings.Contains(err.Error(), "already allocated") && !strings.Contains(err.Error(), "address already in use") {
			t.Fatal(err)
		}
	}
	t.Skip("no free slot port 7051-7099 on 127.0.0.1")
	return 0
}

// State returns a container's Docker state (running, exited, ...).
func State(t testing.TB, c *docker.Client, name string) string {
	t.Helper()
	res, err := c.API().ContainerInspect(context.Background(), name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(res.Container.State.Status)
}
