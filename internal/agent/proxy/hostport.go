package proxy

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// hostPortKey prefixes a pod's key in the queue and in services: its
// hostPorts are frontends as a Service's ports are.
const hostPortKey = "hostport:"

// HostPort is one hostPort of a pod on this node, as the kubelet's CNI
// portmap serves it: connections (or datagrams) to HostIP:Port are relayed
// to Target, the pod's address and containerPort. An unset or unspecified
// HostIP is every node address.
type HostPort struct {
	Protocol corev1.Protocol
	HostIP   netip.Addr
	Port     uint16
	Target   netip.AddrPort
}

// SetHostPorts sets the hostPorts of pod (namespace/name) on this node; nil
// removes them. The node calls it as its pods get addresses and end; it may
// be called before Run, which then serves what was set.
func (p *Proxy) SetHostPorts(pod string, ports []HostPort) {
	p.hpMu.Lock()
	defer p.hpMu.Unlock()
	if slices.Equal(p.hostPorts[pod], ports) {
		return
	}
	if len(ports) == 0 {
		delete(p.hostPorts, pod)
	} else {
		p.hostPorts[pod] = slices.Clone(ports)
	}
	if p.hpQueue != nil {
		p.hpQueue.Add(hostPortKey + pod)
	}
}

// startHostPorts hands Run's queue to SetHostPorts and queues every pod set
// before.
func (p *Proxy) startHostPorts() {
	p.hpMu.Lock()
	defer p.hpMu.Unlock()
	p.hpQueue = p.queue
	for pod := range p.hostPorts {
		p.queue.Add(hostPortKey + pod)
	}
}

// syncHostPorts brings the sockets of pod's hostPorts in line with what
// SetHostPorts last said.
func (p *Proxy) syncHostPorts(key, pod string) error {
	p.hpMu.Lock()
	ports := p.hostPorts[pod]
	p.hpMu.Unlock()
	want := map[listenerKey]frontendSpec{}
	for _, hp := range ports {
		addrs := []netip.Addr{hp.HostIP}
		if !hp.HostIP.IsValid() || hp.HostIP.IsUnspecified() {
			addrs = p.cfg.NodeIPs
		}
		for _, a := range addrs {
			k := listenerKey{proto: hp.Protocol, addr: netip.AddrPortFrom(a, hp.Port)}
			want[k] = frontendSpec{key: k, kind: kindHostPort, portName: fmt.Sprint(hp.Port), endpoints: []netip.AddrPort{hp.Target}}
		}
	}
	if len(want) == 0 {
		p.removeService(key)
		return nil
	}
	_, retry := p.applyFrontends(key, want, func(k listenerKey, s frontendSpec, err error) {
		// The scheduler keeps two pods off one hostPort; what holds it
		// here is a process of the host.
		p.log.Warn("hostPort: cannot listen; retrying", "pod", pod, "address", k.String(), "err", err)
	})
	if retry {
		p.queue.AddAfter(key, p.cfg.RetryInterval)
	}
	return nil
}
