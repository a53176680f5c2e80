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

// NodeContainer is a kind control-plane container as Docker reports it.
type NodeContainer struct {
	Cluster   string
	Container string
	State     string // Docker state: running, exited, ...
	APIPort   int    // host port published for 6443/tcp (0 if none)
}

// Slot derives the slot from the published API port.
func (n NodeContainer) Slot() (slot.Slot, bool) { return slot.FromAPIPort(n.APIPort) }

// Inventory lists the kind clusters that exist on the machine's Docker engine.
type Inventory interface {
	ControlPlanes(ctx context.Context) ([]NodeContainer, error)
}

// DockerInventory reads kind's control-plane containers through the Docker
// Engine API (not by parsing CLI output).
type DockerInventory struct {
	// Host is DOCKER_HOST (e.g. unix:///Users/me/.klimax.docker.sock); ""
	// uses the client's environment defaults.
	Host string
}

func (d DockerInventory) ControlPlanes(ctx context.Context) ([]NodeContainer, error) {
	opts := []client.Opt{client.FromEnv}
	if d.Host != "" {
		opts = append(opts, client.WithHost(d.Host))
	}
	c, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	defer c.Close()
	res, err := c.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", kindRoleLabel+"=control-plane"),
	})
	if err != nil {
		return nil, fmt.Errorf("list kind nodes (is the VM up? run klimax up): %w", err)
	}
	var out []NodeContainer
	for _, s := range res.Items {
		n := NodeContainer{Cluster: s.Labels[kindClusterLabel], State: string(s.State)}
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
