package cluster_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/cluster/clustertest"
	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker/dockertest"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
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

// runnerFunc adapts a function to vm.Runner.
type runnerFunc func(ctx context.Context, argv []string, opts vm.RunOptions) (vm.Result, error)

func (f runnerFunc) Run(ctx context.Context, argv []string, opts vm.RunOptions) (vm.Result, error) {
	return f(ctx, argv, opts)
}

// TestIntegrationStopStartNodes: `cluster stop` stops every node container
// of the cluster on a real engine (and nothing else), `cluster start`
// starts them again with the same published API port and waits for the API.
func TestIntegrationStopStartNodes(t *testing.T) {
	c := dockertest.Engine(t)
	ref := "klimax-test/fake-node:" + dockertest.UniqueName("t")
	dockertest.RegistryImage(t, c, ref)
	name := dockertest.UniqueName("klimaxss")
	other := dockertest.UniqueName("klimaxother")
	// A slot port, so the cluster counts as klimax's (slot = port - 7000).
	port := dockertest.KindControlPlaneOnSlotPort(t, c, ref, name, name+"-control-plane")
	dockertest.KindNode(t, c, ref, name, "worker", name+"-worker", 0)
	dockertest.KindNode(t, c, ref, other, "control-plane", other+"-control-plane", dockertest.FreePort(t))
	ctx := context.Background()
	inv := cluster.DockerInventory{}
	nodes, err := inv.Nodes(ctx, name)
	if err != nil || len(nodes) != 2 || nodes[0].Role != "control-plane" || nodes[1].Container != name+"-worker" || nodes[0].APIPort != port {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}
	kubes := clustertest.NewKubes()
	home := t.TempDir()
	m := &cluster.Manager{Config: config.Default(), Inventory: inv, NewKube: kubes.New,
		APIHost: func(context.Context) (string, error) { return "127.0.0.1", nil },
		KubeDir: filepath.Join(home, "kube"),
		Runner: runnerFunc(func(ctx context.Context, argv []string, opts vm.RunOptions) (vm.Result, error) {
			if strings.Join(argv, " ") == "kind get kubeconfig --name "+name {
				return vm.Result{Stdout: []byte(clustertest.Kubeconfig(name, port))}, nil
			}
			return vm.Result{}, fmt.Errorf("unexpected %q", argv)
		})}
	stopped, err := m.Stop(ctx, name)
	if err != nil || len(stopped) != 2 {
		t.Fatalf("stop: %v %v", stopped, err)
	}
	state := func(ctr string) string { return dockertest.State(t, c, ctr) }
	if state(name+"-control-plane") != "exited" || state(name+"-worker") != "exited" || state(other+"-control-plane") != "running" {
		t.Errorf("after stop: %s %s, other %s", state(name+"-control-plane"), state(name+"-worker"), state(other+"-control-plane"))
	}
	if err := m.Start(ctx, name, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if state(name+"-control-plane") != "running" || state(name+"-worker") != "running" {
		t.Errorf("after start: %s %s", state(name+"-control-plane"), state(name+"-worker"))
	}
	nodes, _ = inv.Nodes(ctx, name)
	if nodes[0].APIPort != port {
		t.Errorf("API port after start: %d, want %d", nodes[0].APIPort, port)
	}
	if log := kubes.ByURL["https://127.0.0.1:"+strconv.Itoa(port)].Log; len(log) == 0 || log[len(log)-1] != "wait ready" {
		t.Errorf("start did not wait for the API: %q", log)
	}
}
