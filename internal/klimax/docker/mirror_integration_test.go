package docker_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/moby/client"

	"github.com/k3sm-dev/k3sm/internal/klimax/docker"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker/dockertest"
)

// A mirror whose host port is taken fails with the port and the fix and
// leaves no container: on a local engine the port is checked before
// anything is created; on an engine elsewhere (a VM, here the same engine
// through an explicit DOCKER_HOST) the failed start is cleaned up. Before,
// a Created container stayed behind.
func TestIntegrationMirrorPortTaken(t *testing.T) {
	c := dockertest.Engine(t)
	ctx := context.Background()
	image := "klimax-test-registry:" + dockertest.UniqueName("pt")
	dockertest.RegistryImage(t, c, image)
	netName := dockertest.UniqueName("klimax-pt-net")
	t.Cleanup(func() { c.API().NetworkRemove(context.Background(), netName, client.NetworkRemoveOptions{}) })
	if _, err := c.EnsureNetwork(ctx, docker.NetworkSpec{Name: netName, Subnet: dockertest.FreeBridgeCIDR(t, c)}); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port

	remote, err := docker.New("unix:///var/run/docker.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	for _, tc := range []struct {
		what string
		c    *docker.Client
	}{{"local engine", c}, {"engine elsewhere", remote}} {
		name := dockertest.UniqueName("klimax-pt-mirror")
		t.Cleanup(func() {
			c.API().ContainerRemove(context.Background(), name, client.ContainerRemoveOptions{Force: true})
		})
		spec := docker.MirrorSpec{Name: name, Port: port, RemoteURL: "http://upstream:5000", Image: image, Network: netName,
			CacheDir: t.TempDir(), PublishIP: netip.MustParseAddr("127.0.0.1")}
		_, err := tc.c.EnsureMirror(ctx, spec)
		var pe *docker.PortInUseError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(port)) || !strings.Contains(err.Error(), "fix:") {
			t.Errorf("%s: %v, want the port in use and the fix", tc.what, err)
		}
		if _, err := c.API().ContainerInspect(ctx, name, client.ContainerInspectOptions{}); err == nil {
			t.Errorf("%s: the mirror container was left behind", tc.what)
		}
	}
}

// PruneMirrors removes only klimax mirrors not kept, on that network.
func TestIntegrationPruneMirrors(t *testing.T) {
	c := dockertest.Engine(t)
	ctx := context.Background()
	image := "klimax-test-registry:" + dockertest.UniqueName("pr")
	dockertest.RegistryImage(t, c, image)
	netName := dockertest.UniqueName("klimax-pr-net")
	t.Cleanup(func() { c.API().NetworkRemove(context.Background(), netName, client.NetworkRemoveOptions{}) })
	if _, err := c.EnsureNetwork(ctx, docker.NetworkSpec{Name: netName, Subnet: dockertest.FreeBridgeCIDR(t, c)}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := 0; i < 2; i++ {
		name := dockertest.UniqueName("klimax-pr-mirror")
		names = append(names, name)
		t.Cleanup(func() {
			c.API().ContainerRemove(context.Background(), name, client.ContainerRemoveOptions{Force: true})
		})
		if _, err := c.EnsureMirror(ctx, docker.MirrorSpec{Name: name, Port: dockertest.FreePort(t), RemoteURL: "http://upstream:5000",
			Image: image, Network: netName, CacheDir: t.TempDir(), PublishIP: netip.MustParseAddr("127.0.0.1")}); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := c.PruneMirrors(ctx, netName, names[:1])
	if err != nil || len(removed) != 1 || removed[0] != names[1] {
		t.Fatalf("prune: %v %v", removed, err)
	}
	left, _ := c.ManagedMirrors(ctx, netName)
	if len(left) != 1 || left[0] != names[0] {
		t.Errorf("left %v", left)
	}
}

// ImageExists (the `cluster load` pre-check) on the real engine.
func TestIntegrationImageExists(t *testing.T) {
	c := dockertest.Engine(t)
	ref := "klimax-test-registry:" + dockertest.UniqueName("ie")
	dockertest.RegistryImage(t, c, ref)
	if ok, err := c.ImageExists(context.Background(), ref); !ok || err != nil {
		t.Errorf("loaded image: %v %v", ok, err)
	}
	if ok, err := c.ImageExists(context.Background(), ref+"-missing"); ok || err != nil {
		t.Errorf("missing image: %v %v", ok, err)
	}
}
