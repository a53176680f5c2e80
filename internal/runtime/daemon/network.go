package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	netdclient "github.com/k3sm-dev/k3sm/internal/netd/client"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
	"github.com/k3sm-dev/k3sm/internal/runtime/pod"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// netdNetwork is pod.Network through k3sm-netd: netd makes every namespace,
// link and address; the daemon only asks, over netd's typed RPC.
type netdNetwork struct {
	c *netdclient.Client
	// The node's Service and cluster ranges, passed on with the pod range.
	serviceCIDR, clusterCIDR string

	// shim is set when the daemon is not root: each pod's namespaces are
	// made by a holder (the shim binary) in a user namespace of the
	// daemon's, which netd pins (sandbox.NewPodNamespaces).
	shim string

	mu   sync.Mutex
	cidr string // the pod range last configured (reported by GetRuntimeInfo)
}

func newNetdNetwork(socket, serviceCIDR, clusterCIDR, shim string) *netdNetwork {
	return &netdNetwork{c: netdclient.New(socket), serviceCIDR: serviceCIDR, clusterCIDR: clusterCIDR, shim: shim}
}

func (n *netdNetwork) Setup(ctx context.Context, uid, namespace, name string) (pod.PodNetwork, error) {
	pid := 0
	if n.shim != "" {
		h, err := sandbox.NewPodNamespaces(n.shim)
		if err != nil {
			return pod.PodNetwork{}, err
		}
		defer h.Close() // pinned by netd by then
		pid = h.Pid
	}
	r, err := n.c.SetupPodFrom(ctx, uid, namespace, name, pid)
	if err != nil {
		if netdclient.IsNotConfigured(err) {
			return pod.PodNetwork{}, pod.ErrNetworkNotReady
		}
		return pod.PodNetwork{}, err
	}
	if _, err := netip.ParseAddr(r.IP); err != nil {
		return pod.PodNetwork{}, errors.New("k3sm-netd answered without a valid pod address: " + r.IP)
	}
	if pid != 0 && r.UserNS == "" {
		return pod.PodNetwork{}, errors.New("k3sm-netd answered without the pod's user namespace: is it older than this runtime?")
	}
	return pod.PodNetwork{IP: r.IP, NetNS: r.NetNS, UserNS: r.UserNS}, nil
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

// SetPolicy hands netd a pod's NetworkPolicy.
func (n *netdNetwork) SetPolicy(ctx context.Context, a wire.SetPolicyArgs) error {
	return n.c.SetPolicy(ctx, a)
}

// netdStatus maps netd's refusals onto the codes the contract promises.
func netdStatus(err error) error {
	var e *netdclient.Error
	if !errors.As(err, &e) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return status.FromContextError(err).Err()
		}
		return status.Errorf(codes.Unavailable, "k3sm-netd: %v", err)
	}
	switch e.Code {
	case wire.CodeNotFound:
		return status.Error(codes.NotFound, err.Error())
	case wire.CodeUnsupported:
		return status.Error(codes.Unimplemented, err.Error())
	case wire.CodeInvalid:
		return status.Error(codes.InvalidArgument, err.Error())
	case wire.CodeNotConfigured:
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// wirePolicy converts the request; netd validates the result (the
// client before sending, the server again). Empty lists stay nil: the
// wire refuses an empty list that is present.
func wirePolicy(req *runtimev1.SetPodNetworkPolicyRequest) (wire.SetPolicyArgs, error) {
	a := wire.SetPolicyArgs{UID: req.GetPodUid()}
	for _, side := range []struct {
		in  *runtimev1.NetworkPolicyDirection
		out *wire.PolicyDirection
	}{{req.GetPolicy().GetIngress(), &a.Ingress}, {req.GetPolicy().GetEgress(), &a.Egress}} {
		side.out.Isolated = side.in.GetIsolated()
		for _, r := range side.in.GetRules() {
			var rule wire.PolicyRule
			for _, p := range r.GetPeers() {
				peer := wire.PolicyPeer{CIDR: p.GetCidr()}
				if len(p.GetExcept()) > 0 {
					peer.Except = append([]string(nil), p.GetExcept()...)
				}
				rule.Peers = append(rule.Peers, peer)
			}
			for _, p := range r.GetPorts() {
				if p.GetPort() > 65535 || p.GetEndPort() > 65535 {
					return a, fmt.Errorf("port %d-%d is not a port number", p.GetPort(), p.GetEndPort())
				}
				rule.Ports = append(rule.Ports, wire.PolicyPort{Protocol: p.GetProtocol(), Port: uint16(p.GetPort()), EndPort: uint16(p.GetEndPort())})
			}
			side.out.Rules = append(side.out.Rules, rule)
		}
	}
	return a, nil
}
