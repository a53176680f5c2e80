package cluster_test

import (
	"context"
	"net/netip"
	"strconv"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker/dockertest"
)

// TestIntegrationDockerInventory runs a container labelled like a kind
// control-plane node, publishing 6443 on a loopback port, and checks that the
// Engine-API inventory reports its cluster, state and API port (= slot).
func TestIntegrationDockerInventory(t *testing.T) {
	c := dockertest.Engine(t)
	ref := "klimax-test/fake-node:" + dockertest.UniqueName("t")
	dockertest.RegistryImage(t, c, ref)
	name := dockertest.UniqueName("klimaxinv")
	port := dockertest.FreePort(t)
	ctx := context.Background()
	p := network.MustParsePort("6443/tcp")
	_, err := c.API().ContainerCreate(ctx, client.ContainerCreateOptions{Name: name + "-control-plane",
		Config: &container.Config{Image: ref, ExposedPorts: network.PortSet{p: struct{}{}},
			Labels: map[string]string{"io.x-k8s.kind.cluster": name, "io.x-k8s.kind.role": "control-plane"}},
		HostConfig: &container.HostConfig{PortBindings: network.PortMap{p: {{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(port)}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.API().ContainerRemove(context.Background(), name+"-control-plane", client.ContainerRemoveOptions{Force: true})
	})
	if _, err := c.API().ContainerStart(ctx, name+"-control-plane", client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	nodes, err := cluster.DockerInventory{}.ControlPlanes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var found *cluster.NodeContainer
	for i := range nodes {
		if nodes[i].Cluster == name {
			found = &nodes[i]
		}
	}
	if found == nil {
		t.Fatalf("cluster %s not listed in %+v", name, nodes)
	}
	if found.APIPort != port || found.State != "running" || found.Container != name+"-control-plane" {
		t.Errorf("got %+v, want port %d running", found, port)
	}
}
