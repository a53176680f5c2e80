package proxy

import (
	"context"

	"github.com/k3sm-dev/k3sm/internal/netd/client"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

// NetdKernel is the Kernel of k3sm-netd's socket: its SetServices verb
// programs table ip k3sm-services.
type NetdKernel struct{ Client *client.Client }

// SetServices sends the set to netd (in chunks; netd applies them at once).
func (k NetdKernel) SetServices(ctx context.Context, svcs []KernelService) error {
	out := make([]wire.ServicePort, 0, len(svcs))
	for _, s := range svcs {
		sp := wire.ServicePort{Protocol: string(s.Protocol), IP: s.IP.String(), Port: s.Port, External: s.External,
			NodePort: s.NodePort, LoadBalancer: s.LoadBalancer, Local: s.Local}
		for _, e := range s.Endpoints {
			sp.Endpoints = append(sp.Endpoints, wire.Endpoint{IP: e.Addr().String(), Port: e.Port()})
		}
		out = append(out, sp)
	}
	return k.Client.SetServices(ctx, out)
}
