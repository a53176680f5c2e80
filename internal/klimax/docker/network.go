package docker

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
)

// NetworkSpec is the shared bridge network the clusters and mirrors use.
type NetworkSpec struct {
	// Name is "kind" in real use (kind requires it); tests use their own.
	Name string
	// Subnet is the bridge CIDR; the gateway is its .1 address.
	Subnet netip.Prefix
}

// ContainerRange is where Docker may place containers (kind nodes, mirrors):
// the subnet's first /24. Slot N's MetalLB pool is <prefix>.N.x with N >= 1,
// so container addresses can never land inside a load-balancer pool.
func (s NetworkSpec) ContainerRange() netip.Prefix {
	p := s.Subnet.Masked()
	if p.Bits() >= 24 {
		return p
	}
	return netip.PrefixFrom(p.Addr(), 24)
}

// Gateway is the first address of the subnet.
func (s NetworkSpec) Gateway() netip.Addr { return s.Subnet.Masked().Addr().Next() }

// NetworkInfo is what klimax reads back about the network.
type NetworkInfo struct {
	Name       string
	ID         string
	Driver     string
	Subnets    []netip.Prefix
	Gateways   []netip.Addr
	Bridge     string // Linux bridge device (br-<id12> unless named)
	Managed    bool   // carries klimax's managed-by label
	Containers []string
}

// ClashError reports that the configured bridge CIDR cannot be used.
type ClashError struct {
	Msg, Fix string
}

func (e *ClashError) Error() string { return e.Msg + " (fix: " + e.Fix + ")" }

// InspectNetwork returns the network called name, or nil when absent.
func (c *Client) InspectNetwork(ctx context.Context, name string) (*NetworkInfo, error) {
	res, err := c.api.NetworkInspect(ctx, name, client.NetworkInspectOptions{})
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect network %s: %w", name, err)
	}
	n := res.Network
	if n.Name != name { // the API also matches ID prefixes
		return nil, nil
	}
	info := &NetworkInfo{Name: n.Name, ID: n.ID, Driver: n.Driver, Managed: n.Labels[LabelManagedBy] == ManagedBy}
	for _, cfg := range n.IPAM.Config {
		if cfg.Subnet.IsValid() {
			info.Subnets = append(info.Subnets, cfg.Subnet)
		}
		if cfg.Gateway.IsValid() {
			info.Gateways = append(info.Gateways, cfg.Gateway)
		}
	}
	info.Bridge = n.Options["com.docker.network.bridge.name"]
	if info.Bridge == "" && len(n.ID) >= 12 {
		info.Bridge = "br-" + n.ID[:12]
	}
	for _, ep := range n.Containers {
		info.Containers = append(info.Containers, ep.Name)
	}
	sort.Strings(info.Containers)
	return info, nil
}

// CheckNetwork compares an existing network with spec; nil means it fits.
func CheckNetwork(info *NetworkInfo, spec NetworkSpec) error {
	if info.Driver != "bridge" {
		return &ClashError{
			Msg: fmt.Sprintf("docker network %q exists with driver %q, not bridge", info.Name, info.Driver),
			Fix: fmt.Sprintf("remove it (docker network rm %s) after deleting what uses it", info.Name),
		}
	}
	for i, s := range info.Subnets {
		if s.Addr().Is4() {
			if s.Masked() != spec.Subnet.Masked() {
				return &ClashError{
					Msg: fmt.Sprintf("docker network %q exists with subnet %s but network.kindBridgeCIDR is %s", info.Name, s, spec.Subnet),
					Fix: fmt.Sprintf("set network.kindBridgeCIDR to %s, or delete every cluster and run `docker network rm %s`", s, info.Name),
				}
			}
			if i < len(info.Gateways) && info.Gateways[i] != spec.Gateway() {
				return &ClashError{
					Msg: fmt.Sprintf("docker network %q has gateway %s, klimax expects %s", info.Name, info.Gateways[i], spec.Gateway()),
					Fix: fmt.Sprintf("delete every cluster and run `docker network rm %s`, then `klimax up`", info.Name),
				}
			}
			return nil
		}
	}
	return &ClashError{
		Msg: fmt.Sprintf("docker network %q exists without an IPv4 subnet", info.Name),
		Fix: fmt.Sprintf("delete every cluster and run `docker network rm %s`", info.Name),
	}
}

// overlappingNetworks lists other Docker networks whose subnets overlap p.
func (c *Client) overlappingNetworks(ctx context.Context, name string, p netip.Prefix) ([]string, error) {
	res, err := c.api.NetworkList(ctx, client.NetworkListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list networks: %w", err)
	}
	var out []string
	for _, n := range res.Items {
		if n.Name == name {
			continue
		}
		for _, cfg := range n.IPAM.Config {
			if cfg.Subnet.IsValid() && cfg.Subnet.Overlaps(p) {
				out = append(out, fmt.Sprintf("%s (%s)", n.Name, cfg.Subnet))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// EnsureNetwork creates the bridge network with spec's subnet and .1
// gateway, or verifies an existing one. An existing network with another
// subnet, or another Docker network overlapping the CIDR, is refused with a
// ClashError. It reports whether it created the network.
func (c *Client) EnsureNetwork(ctx context.Context, spec NetworkSpec) (bool, error) {
	if !spec.Subnet.IsValid() || !spec.Subnet.Addr().Is4() {
		return false, fmt.Errorf("network %s: invalid IPv4 subnet %v", spec.Name, spec.Subnet)
	}
	info, err := c.InspectNetwork(ctx, spec.Name)
	if err != nil {
		return false, err
	}
	if info != nil {
		return false, CheckNetwork(info, spec)
	}
	others, err := c.overlappingNetworks(ctx, spec.Name, spec.Subnet)
	if err != nil {
		return false, err
	}
	if len(others) > 0 {
		return false, &ClashError{
			Msg: fmt.Sprintf("network.kindBridgeCIDR %s overlaps docker network(s) %s", spec.Subnet, strings.Join(others, ", ")),
			Fix: "choose another network.kindBridgeCIDR in ~/.klimax/config.yaml, or remove the overlapping network",
		}
	}
	yes := true
	_, err = c.api.NetworkCreate(ctx, spec.Name, client.NetworkCreateOptions{
		Driver:     "bridge",
		EnableIPv4: &yes,
		IPAM: &network.IPAM{
			Driver: "default",
			Config: []network.IPAMConfig{{Subnet: spec.Subnet.Masked(), Gateway: spec.Gateway(), IPRange: spec.ContainerRange()}},
		},
		Options: map[string]string{
			// kind's own network settings: containers may talk to each other
			// and reach outside through NAT (the no-SNAT rules exempt the
			// VM's network only).
			"com.docker.network.bridge.enable_ip_masquerade": "true",
			"com.docker.network.driver.mtu":                  "1500",
		},
		Labels: map[string]string{LabelManagedBy: ManagedBy},
	})
	if isConflict(err) {
		// Created concurrently: verify what is there now.
		if info, err := c.InspectNetwork(ctx, spec.Name); err == nil && info != nil {
			return false, CheckNetwork(info, spec)
		}
	}
	if err != nil {
		return false, fmt.Errorf("create docker network %s (%s): %w", spec.Name, spec.Subnet, err)
	}
	return true, nil
}

// RemoveNetwork removes the network if klimax created it. It refuses while
// containers are still attached, naming them.
func (c *Client) RemoveNetwork(ctx context.Context, name string) (bool, error) {
	info, err := c.InspectNetwork(ctx, name)
	if err != nil || info == nil {
		return false, err
	}
	if !info.Managed {
		return false, nil // not ours (e.g. created by plain kind): leave it
	}
	if len(info.Containers) > 0 {
		return false, fmt.Errorf("docker network %s still has containers attached: %s (fix: delete the clusters first with `klimax cluster delete`)",
			name, strings.Join(info.Containers, ", "))
	}
	if _, err := c.api.NetworkRemove(ctx, name, client.NetworkRemoveOptions{}); err != nil && !isNotFound(err) {
		return false, fmt.Errorf("remove docker network %s: %w", name, err)
	}
	return true, nil
}
