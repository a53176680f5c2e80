package docker_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/k3sm-dev/k3sm/internal/klimax/docker"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker/dockertest"
)

func TestIntegrationNetworkEnsureAndClash(t *testing.T) {
	c := dockertest.Engine(t)
	ctx := context.Background()
	cidr := dockertest.FreeBridgeCIDR(t, c)
	name := dockertest.UniqueName("klimax-test-net")
	t.Cleanup(func() { c.API().NetworkRemove(context.Background(), name, client.NetworkRemoveOptions{}) })
	spec := docker.NetworkSpec{Name: name, Subnet: cidr}

	created, err := c.EnsureNetwork(ctx, spec)
	if err != nil || !created {
		t.Fatalf("EnsureNetwork = %v, %v; want created", created, err)
	}
	info, err := c.InspectNetwork(ctx, name)
	if err != nil || info == nil {
		t.Fatalf("inspect: %v %v", info, err)
	}
	if len(info.Subnets) != 1 || info.Subnets[0] != cidr || len(info.Gateways) != 1 || info.Gateways[0] != spec.Gateway() || !info.Managed {
		t.Fatalf("network = %+v; want subnet %s gateway %s managed", info, cidr, spec.Gateway())
	}
	if created, err := c.EnsureNetwork(ctx, spec); err != nil || created {
		t.Fatalf("second EnsureNetwork = %v, %v; want no change", created, err)
	}

	// Same name, other subnet: refused with a fix, network untouched.
	other := netip.MustParsePrefix(fmt.Sprintf("%d.%d.0.0/16", cidr.Addr().As4()[0], cidr.Addr().As4()[1]-1))
	_, err = c.EnsureNetwork(ctx, docker.NetworkSpec{Name: name, Subnet: other})
	var clash *docker.ClashError
	if !errors.As(err, &clash) {
		t.Fatalf("EnsureNetwork with other subnet: err = %v; want ClashError", err)
	}
	t.Logf("clash message: %v", err)

	// Another name overlapping the existing network: refused before Docker.
	name2 := dockertest.UniqueName("klimax-test-net2")
	t.Cleanup(func() { c.API().NetworkRemove(context.Background(), name2, client.NetworkRemoveOptions{}) })
	_, err = c.EnsureNetwork(ctx, docker.NetworkSpec{Name: name2, Subnet: cidr})
	if !errors.As(err, &clash) {
		t.Fatalf("overlapping network: err = %v; want ClashError", err)
	}
	if n, _ := c.InspectNetwork(ctx, name2); n != nil {
		t.Fatal("overlapping network was created")
	}

	// A network klimax did not create is never removed.
	name3 := dockertest.UniqueName("klimax-test-foreign")
	third := netip.MustParsePrefix(fmt.Sprintf("%d.%d.0.0/16", cidr.Addr().As4()[0], cidr.Addr().As4()[1]-2))
	if _, err := c.API().NetworkCreate(ctx, name3, client.NetworkCreateOptions{Driver: "bridge",
		IPAM: &network.IPAM{Config: []network.IPAMConfig{{Subnet: third}}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.API().NetworkRemove(context.Background(), name3, client.NetworkRemoveOptions{}) })
	if removed, err := c.RemoveNetwork(ctx, name3); err != nil || removed {
		t.Fatalf("RemoveNetwork(foreign) = %v, %v; want left alone", removed, err)
	}
	if removed, err := c.RemoveNetwork(ctx, name); err != nil || !removed {
		t.Fatalf("RemoveNetwork = %v, %v", removed, err)
	}
	if n, _ := c.InspectNetwork(ctx, name); n != nil {
		t.Fatal("network still exists after RemoveNetwork")
	}
}
