package node

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
)

// hostPortsOf are pod's hostPorts as the Service proxy serves them (the
// kubelet's CNI portmap): none for a pod in the node's network, whose
// process holds the port itself; none before the pod has an address or
// after it ended.
func hostPortsOf(pod *corev1.Pod, final, podNetwork bool) []proxy.HostPort {
	if final || !podNetwork || pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil {
		return nil
	}
	var out []proxy.HostPort
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for _, cp := range c.Ports {
			if cp.HostPort <= 0 || cp.HostPort > 65535 || cp.ContainerPort <= 0 || cp.ContainerPort > 65535 {
				continue
			}
			proto := cp.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			if proto != corev1.ProtocolTCP && proto != corev1.ProtocolUDP {
				continue // SCTP: no relay
			}
			hp := proxy.HostPort{Protocol: proto, Port: uint16(cp.HostPort), Target: netip.AddrPortFrom(ip, uint16(cp.ContainerPort))}
			if cp.HostIP != "" {
				if a, err := netip.ParseAddr(cp.HostIP); err == nil {
					hp.HostIP = a
				}
			}
			out = append(out, hp)
		}
	}
	return out
}

// setHostPortSink gives the provider the proxy's SetHostPorts and tells it
// the hostPorts of the pods known so far.
func (p *Provider) setHostPortSink(set func(pod string, ports []proxy.HostPort)) {
	p.mu.Lock()
	p.hostPorts = set
	var pods []*corev1.Pod
	for _, st := range p.pods {
		if st.pod != nil && !st.gone {
			pods = append(pods, st.pod.DeepCopy())
		}
	}
	p.mu.Unlock()
	for _, pod := range pods {
		set(pod.Namespace+"/"+pod.Name, hostPortsOf(pod, false, p.podNetwork))
	}
}

// publishHostPorts tells the proxy pod's hostPorts after its status changed.
func (p *Provider) publishHostPorts(pod *corev1.Pod, final bool) {
	p.mu.Lock()
	set := p.hostPorts
	p.mu.Unlock()
	if set != nil {
		set(pod.Namespace+"/"+pod.Name, hostPortsOf(pod, final, p.podNetwork))
	}
}
