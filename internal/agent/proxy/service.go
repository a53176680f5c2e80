package proxy

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// kind says which address of a Service a frontend serves; it decides the
// traffic policy (internal for ClusterIP, external for the others, as
// kube-proxy applies externalTrafficPolicy to externalIPs too).
type kind uint8

const (
	kindClusterIP kind = iota
	kindNodePort
	kindLoadBalancer
	kindExternalIP // an address of spec.externalIPs
	kindHostPort   // a pod's hostPort (SetHostPorts), relayed to the pod
)

func (k kind) String() string {
	switch k {
	case kindNodePort:
		return "NodePort"
	case kindLoadBalancer:
		return "LoadBalancer"
	case kindExternalIP:
		return "ExternalIP"
	case kindHostPort:
		return "HostPort"
	}
	return "ClusterIP"
}

// listenerKey identifies a frontend socket.
type listenerKey struct {
	proto corev1.Protocol
	addr  netip.AddrPort
}

func (k listenerKey) String() string { return k.addr.String() + "/" + string(k.proto) }

// frontendSpec is what one listening socket of a Service should do.
type frontendSpec struct {
	key       listenerKey
	kind      kind
	portName  string
	endpoints []netip.AddrPort // sorted; empty: the socket stays closed
	affinity  time.Duration    // ClientIP affinity timeout; 0: none
	allow     []netip.Prefix   // nil: every source
	// local: externalTrafficPolicy Local on a NodePort, LoadBalancer or
	// externalIP frontend (endpoints are this node's); the kernel path
	// keeps the client's address for it.
	local bool
}

const (
	// labelProxyName on a Service hands it to another proxy; kube-proxy
	// ignores such Services too.
	labelProxyName = "service.kubernetes.io/service-proxy-name"
	// annSourceRanges is the legacy spelling of loadBalancerSourceRanges.
	annSourceRanges = "service.beta.kubernetes.io/load-balancer-source-ranges"
	// defaultAffinity is the API's default sessionAffinityConfig timeout.
	defaultAffinity = 10800 * time.Second
)

// handled reports whether the proxy serves svc at all.
func handled(svc *corev1.Service) bool {
	if _, ok := svc.Labels[labelProxyName]; ok {
		return false
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return false
	}
	return svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone
}

// ownsLoadBalancer reports whether this proxy implements svc's load
// balancer; a loadBalancerClass means another implementation does.
func ownsLoadBalancer(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Spec.LoadBalancerClass == nil && handled(svc)
}

// desiredFrontends lists the sockets svc needs on this node, each with the
// endpoints its traffic policy allows.
func desiredFrontends(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node string, nodeIPs, nodePortIPs []netip.Addr) []frontendSpec {
	if !handled(svc) {
		return nil
	}
	clusterIPs, externalIPs := ipv4Addrs(svc.Spec.ClusterIPs), ipv4Addrs(svc.Spec.ExternalIPs)
	var affinity time.Duration
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		affinity = defaultAffinity
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
			affinity = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	internalLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	externalLocal := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	withNodePort := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	lb := ownsLoadBalancer(svc)
	var allow []netip.Prefix
	if lb {
		allow = sourceRanges(svc)
	}

	var out []frontendSpec
	for _, sp := range svc.Spec.Ports {
		if sp.Protocol != corev1.ProtocolTCP && sp.Protocol != corev1.ProtocolUDP {
			continue // SCTP is not proxied
		}
		eps := endpointsFor(sp, slices, node)
		internal, external := choose(eps, internalLocal), choose(eps, externalLocal)
		add := func(ip netip.Addr, port int32, k kind, eps []netip.AddrPort, allow []netip.Prefix) {
			local := externalLocal && k != kindClusterIP
			if port <= 0 || port > 65535 {
				return
			}
			out = append(out, frontendSpec{
				key:       listenerKey{proto: sp.Protocol, addr: netip.AddrPortFrom(ip, uint16(port))},
				kind:      k,
				portName:  sp.Name,
				endpoints: eps,
				affinity:  affinity,
				allow:     allow,
				local:     local,
			})
		}
		for _, ip := range clusterIPs {
			add(ip, sp.Port, kindClusterIP, internal, nil)
		}
		if withNodePort {
			for _, ip := range nodePortIPs {
				add(ip, sp.NodePort, kindNodePort, external, nil)
			}
		}
		if lb {
			for _, ip := range nodeIPs {
				add(ip, sp.Port, kindLoadBalancer, external, allow)
			}
		}
		// externalIPs take the Service's ports on any type (ExternalName
		// aside, which handled skipped), with the external policy.
		for _, ip := range externalIPs {
			add(ip, sp.Port, kindExternalIP, external, nil)
		}
	}
	return out
}

// ipv4Addrs parses the IPv4 addresses of list, once each: the cluster is
// IPv4 only (pods in 100.64.0.0/10).
func ipv4Addrs(list []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range list {
		if ip, err := netip.ParseAddr(s); err == nil && ip.Unmap().Is4() && !slices.Contains(out, ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// sourceRanges parses the Service's loadBalancerSourceRanges (or the
// legacy annotation). nil means every source may connect. Entries that do
// not parse are skipped, but a list with none usable admits nobody rather
// than everybody.
func sourceRanges(svc *corev1.Service) []netip.Prefix {
	raw := svc.Spec.LoadBalancerSourceRanges
	if len(raw) == 0 {
		if a := strings.TrimSpace(svc.Annotations[annSourceRanges]); a != "" {
			raw = strings.Split(a, ",")
		}
	}
	if len(raw) == 0 {
		return nil
	}
	out := []netip.Prefix{}
	for _, s := range raw {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// endpoint is one backend of a Service port as the EndpointSlices say.
type endpoint struct {
	addr                        netip.AddrPort
	ready, serving, terminating bool
	local                       bool
}

// endpointsFor merges the endpoints of every IPv4 slice whose port matches
// sp by name and protocol, one entry per address (slices overlap while the
// EndpointSlice controller moves endpoints between them).
func endpointsFor(sp corev1.ServicePort, list []*discoveryv1.EndpointSlice, node string) []endpoint {
	byAddr := map[netip.AddrPort]endpoint{}
	for _, s := range list {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		var port int32
		for _, p := range s.Ports {
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			if p.Port != nil && proto == sp.Protocol && ptrString(p.Name) == sp.Name {
				port = *p.Port
				break
			}
		}
		if port <= 0 || port > 65535 {
			continue
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			// Like kube-proxy, only the first address is used: the others
			// are the same pod's.
			ip, err := netip.ParseAddr(e.Addresses[0])
			if err != nil || !ip.Unmap().Is4() {
				continue
			}
			ep := endpoint{
				addr:        netip.AddrPortFrom(ip.Unmap(), uint16(port)),
				ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
				serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
				terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
				local:       e.NodeName != nil && *e.NodeName == node,
			}
			if have, ok := byAddr[ep.addr]; ok && rank(have) >= rank(ep) {
				continue
			}
			byAddr[ep.addr] = ep
		}
	}
	out := make([]endpoint, 0, len(byAddr))
	for _, ep := range byAddr {
		out = append(out, ep)
	}
	slices.SortFunc(out, func(a, b endpoint) int { return a.addr.Compare(b.addr) })
	return out
}

// rank orders duplicates of one address: the most usable copy wins.
func rank(e endpoint) int {
	switch {
	case e.ready:
		return 2
	case e.serving:
		return 1
	}
	return 0
}

// choose picks the endpoints traffic may go to: the ready ones (on this
// node only, for a Local policy) or, when none is ready, the serving ones
// that are terminating, as kube-proxy does so that a rolling update of the
// last pods does not drop traffic.
func choose(eps []endpoint, localOnly bool) []netip.AddrPort {
	var ready, fallback []netip.AddrPort
	for _, e := range eps {
		if localOnly && !e.local {
			continue
		}
		if e.ready {
			ready = append(ready, e.addr)
		} else if e.serving && e.terminating {
			fallback = append(fallback, e.addr)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return fallback
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// ingressIPs are the addresses to report as the Service's load balancer:
// the node IPs on which no LoadBalancer socket failed to open, so a node
// whose port is taken is not advertised (as k3s's servicelb leaves it out).
func ingressIPs(nodeIPs []netip.Addr, fronts map[listenerKey]*frontend) []netip.Addr {
	var out []netip.Addr
	for _, ip := range nodeIPs {
		ok := true
		for k, f := range fronts {
			if f.kind == kindLoadBalancer && k.addr.Addr() == ip && f.failed != nil {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out)
}
