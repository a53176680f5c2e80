package cluster

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/moby/moby/client"

	"github.com/k3sm-dev/k3sm/internal/klimax/slot"
)

// kind's node container labels.
const (
	kindClusterLabel = "io.x-k8s.kind.cluster"
	kindRoleLabel    = "io.x-k8s.kind.role"
)

// NodeContainer is a kind node container as Docker reports it.
type NodeContainer struct {
	Cluster   string
	Container string
	Role      string // control-plane or worker (kind's role label)
	State     string // Docker state: running, exited, ...
	APIPort   int    // host port published for 6443/tcp (0 if none)
}

// Slot derives the slot from the published API port.
func (n NodeContainer) Slot() (slot.Slot, bool) { return slot.FromAPIPort(n.APIPort) }

// Inventory lists the kind clusters that exist on the machine's Docker
// engine and stops/starts their node containers (Docker-level: kind has no
// stop/start of its own).
type Inventory interface {
	ControlPlanes(ctx context.Context) ([]NodeContainer, error)
	// Nodes lists every node container of one cluster, control plane first.
	Nodes(ctx context.Context, cluster string) ([]NodeContainer, error)
	// StopNodes stops the containers (already stopped ones are fine).
	StopNodes(ctx context.Context, containers []string) error
	// StartNodes starts the containers (running ones are fine).
	StartNodes(ctx context.Context, containers []string) error
}

// DockerInventory reads kind's control-plane containers through the Docker
// Engine API (not by parsing CLI output).
type DockerInventory struct {
	// Host is DOCKER_HOST (e.g. unix:///Users/me/.klimax.docker.sock); ""
	// uses the client's environment defaults.
	Host string
}

func (d DockerInventory) client() (*client.Client, error) {
	opts := []client.Opt{client.FromEnv}
	if d.Host != "" {
		opts = append(opts, client.WithHost(d.Host))
	}
	c, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	return c, nil
}

func (d DockerInventory) ControlPlanes(ctx context.Context) ([]NodeContainer, error) {
	return d.list(ctx, kindRoleLabel+"=control-plane")
}

func (d DockerInventory) Nodes(ctx context.Context, cluster string) ([]NodeContainer, error) {
	nodes, err := d.list(ctx, kindClusterLabel+"="+cluster)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(nodes, func(i, j int) bool {
		ci, cj := nodes[i].Role == "control-plane", nodes[j].Role == "control-plane"
		if ci != cj {
			return ci
		}
		return nodes[i].Container < nodes[j].Container
	})
	return nodes, nil
}

// nodeStopTimeout is how long a node gets to stop before it is killed
// (systemd in the node shuts the kubelet and containers down).
const nodeStopTimeout = 30

func (d DockerInventory) StopNodes(ctx context.Context, containers []string) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	defer c.Close()
	timeout := nodeStopTimeout
	for _, name := range containers {
		if _, err := c.ContainerStop(ctx, name, client.ContainerStopOptions{Timeout: &timeout}); err != nil {
			return fmt.Errorf("stop node %s: %w", name, err)
		}
	}
	return nil
}

func (d DockerInventory) StartNodes(ctx context.Context, containers []string) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	defer c.Close()
	for _, name := range containers {
		if _, err := c.ContainerStart(ctx, name, client.ContainerStartOptions{}); err != nil {
			return fmt.Errorf("start node %s: %w", name, err)
		}
	}
	return nil
}

func (d DockerInventory) list(ctx context.Context, label string) ([]NodeContainer, error) {
	c, err := d.client()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	res, err := c.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", label),
	})
	if err != nil {
		return nil, fmt.Errorf("list kind nodes (is the VM up? run klimax up): %w", err)
	}
	var out []NodeContainer
	for _, s := range res.Items {
		n := NodeContainer{Cluster: s.Labels[kindClusterLabel], Role: s.Labels[kindRoleLabel], State: string(s.State)}
		if len(s.Names) > 0 {
			n.Container = strings.TrimPrefix(s.Names[0], "/")
		}
		for _, p := range s.Ports {
			if p.PrivatePort == 6443 && p.PublicPort != 0 {
				n.APIPort = int(p.PublicPort)
			}
		}
		if n.Cluster != "" {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cluster < out[j].Cluster })
	return out, nil
}
