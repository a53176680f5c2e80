package node

import "net/netip"

// podNamespace is the namespace of the pod of this node that has address
// ip (not hostNetwork pods: they share the node's). The cluster DNS asks it
// for the PTR of a pod address that backs no Service: the node knows its
// own pods, while a cache of every pod in the cluster would cost memory on
// every node. A linear scan: PTR queries are rare and a node runs at most
// a few hundred pods.
func (p *Provider) podNamespace(ip netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range p.pods {
		if st.pod == nil || st.gone || st.pod.Spec.HostNetwork {
			continue
		}
		for _, a := range st.pod.Status.PodIPs {
			if pa, err := netip.ParseAddr(a.IP); err == nil && pa == ip {
				return st.pod.Namespace, true
			}
		}
	}
	return "", false
}
