package netpol

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// RuntimeApplier applies policies through the runtime daemon, which passes
// them on to k3sm-netd: policies never go from the node to netd directly.
type RuntimeApplier struct {
	Runtime runtimev1.RuntimeClient
}

func (a RuntimeApplier) SetPolicy(ctx context.Context, uid string, p Policy) error {
	_, err := a.Runtime.SetPodNetworkPolicy(ctx, &runtimev1.SetPodNetworkPolicyRequest{PodUid: uid, Policy: toProto(p)})
	switch status.Code(err) {
	case codes.OK:
		return nil
	case codes.Unimplemented, codes.FailedPrecondition:
		return fmt.Errorf("%w: %v", ErrUnsupported, err)
	case codes.NotFound:
		return fmt.Errorf("%w: %v", ErrNoNetwork, err)
	}
	return err
}

func toProto(p Policy) *runtimev1.PodNetworkPolicy {
	dir := func(d Direction) *runtimev1.NetworkPolicyDirection {
		out := &runtimev1.NetworkPolicyDirection{Isolated: d.Isolated}
		for _, r := range d.Rules {
			rule := &runtimev1.NetworkPolicyRule{}
			for _, peer := range r.Peers {
				pp := &runtimev1.NetworkPolicyPeer{Cidr: peer.CIDR.String()}
				for _, e := range peer.Except {
					pp.Except = append(pp.Except, e.String())
				}
				rule.Peers = append(rule.Peers, pp)
			}
			for _, port := range r.Ports {
				rule.Ports = append(rule.Ports, &runtimev1.NetworkPolicyPort{Protocol: string(port.Protocol), Port: uint32(port.Port), EndPort: uint32(port.EndPort)})
			}
			out.Rules = append(out.Rules, rule)
		}
		return out
	}
	return &runtimev1.PodNetworkPolicy{Ingress: dir(p.Ingress), Egress: dir(p.Egress)}
}
