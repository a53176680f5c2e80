package daemon

import (
	"context"
	"errors"
	"net/netip"
	"sync"

	netdclient "github.com/k3sm-dev/k3sm/internal/netd/client"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
	"github.com/k3sm-dev/k3sm/internal/runtime/pod"
)

// netdNetwork is pod.Network through k3sm-netd: netd makes every namespace,
// link and address; the daemon only asks, over netd's typed RPC.
type netdNetwork struct {
	c *netdclient.Client
	// The node's Service and cluster ranges, passed on with the pod range.
	serviceCIDR, clusterCIDR string

	mu   sync.Mutex
	cidr string // the pod range last configured (reported by GetRuntimeInfo)
}

func newNetdNetwork(socket, serviceCIDR, clusterCIDR string) *netdNetwork {
	return &netdNetwork{c: netdclient.New(socket), serviceCIDR: serviceCIDR, clusterCIDR: clusterCIDR}
}

func (n *netdNetwork) Setup(ctx context.Context, uid, namespace, name string) (pod.PodNetwork, error) {
	r, err := n.c.SetupPod(ctx, uid, namespace, name)
	if err != nil {
		var e *netdclient.Error
		if errors.As(err, &e) && e.Code == "not-configured" {
			return pod.PodNetwork{}, pod.ErrNetworkNotReady
		}
		return pod.PodNetwork{}, err
	}
	if _, err := netip.ParseAddr(r.IP); err != nil {
		return pod.PodNetwork{}, errors.New("k3sm-netd answered without a valid pod address: " + r.IP)
	}
	return pod.PodNetwork{IP: r.IP, NetNS: r.NetNS}, nil
}

func (n *netdNetwork) Teardown(ctx context.Context, uid string) error {
	if err := n.c.TeardownPod(ctx, uid); err != nil && !netdclient.IsNotFound(err) {
		return err
	}
	return nil
}

func (n *netdNetwork) Pods(ctx context.Context) ([]string, error) {
	pods, err := n.c.ListPods(ctx)
	if err != nil {
		return nil, err
	}
	uids := make([]string, 0, len(pods))
	for _, p := range pods {
		uids = append(uids, p.UID)
	}
	return uids, nil
}

// Configure hands netd the node's pod range.
func (n *netdNetwork) Configure(ctx context.Context, cidr string) error {
	if _, err := n.c.ConfigureRanges(ctx, wire.ConfigureArgs{PodCIDR: cidr, ServiceCIDR: n.serviceCIDR, ClusterCIDR: n.clusterCIDR}); err != nil {
		return err
	}
	n.mu.Lock()
	n.cidr = cidr
	n.mu.Unlock()
	return nil
}

func (n *netdNetwork) configured() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cidr
}
