package node

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The kubelet's admission of a pod bound to it: what the scheduler checked
// is checked again here, because a pod can be bound with spec.nodeName set
// by its creator (a StatefulSet test, a DaemonSet of old) or race another.
// A pod that does not fit is rejected: phase Failed, the predicate's name
// as reason, and a Warning Event, as the kubelet's rejectPod writes them.

// reasonNodePorts is the kubelet's reason for a hostPort taken on the node
// (the scheduler's NodePorts plugin).
const reasonNodePorts = "NodePorts"

// admit reports why pod cannot run on this node ("" if it can) and, when
// it can, marks it admitted; with p.mu held.
func (p *Provider) admit(uid types.UID, pod *corev1.Pod) (reason, message string) {
	for other, st := range p.pods {
		if other == uid || !(st.admitted || st.known) || st.gone || st.deleting || st.pod == nil {
			continue
		}
		if ph := st.pod.Status.Phase; ph == corev1.PodSucceeded || ph == corev1.PodFailed {
			continue
		}
		if hostPortsConflict(pod, st.pod) {
			return reasonNodePorts, "node(s) didn't have free ports for the requested pod ports"
		}
	}
	p.state(uid).admitted = true
	return "", ""
}

// hostPortsConflict: a and b ask for one hostPort and protocol on the same
// host address (an empty or 0.0.0.0 one is every address).
func hostPortsConflict(a, b *corev1.Pod) bool {
	type port struct {
		proto corev1.Protocol
		ip    string
		port  int32
	}
	ports := func(p *corev1.Pod) []port {
		var out []port
		for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
			for _, cp := range c.Ports {
				if cp.HostPort <= 0 {
					continue
				}
				proto, ip := cp.Protocol, cp.HostIP
				if proto == "" {
					proto = corev1.ProtocolTCP
				}
				if ip == "" || ip == "::" {
					ip = "0.0.0.0"
				}
				out = append(out, port{proto, ip, cp.HostPort})
			}
		}
		return out
	}
	pb := ports(b)
	for _, x := range ports(a) {
		for _, y := range pb {
			if x.proto == y.proto && x.port == y.port && (x.ip == y.ip || x.ip == "0.0.0.0" || y.ip == "0.0.0.0") {
				return true
			}
		}
	}
	return false
}

// reject fails pod for reason, as the kubelet's rejectPod does.
func (p *Provider) reject(pod *corev1.Pod, reason, message string) {
	p.log.Warn("pod rejected", "pod", key(pod.Namespace, pod.Name), "reason", reason, "message", message)
	p.event(pod, "", corev1.EventTypeWarning, reason, message)
	p.mu.Lock()
	p.state(pod.UID).rejected = true
	p.mu.Unlock()
	st := corev1.PodStatus{Phase: corev1.PodFailed, Reason: reason, Message: "Pod was rejected: " + message,
		QOSClass: pod.Status.QOSClass, HostIP: p.nodeIP}
	if p.nodeIP != "" {
		st.HostIPs = []corev1.HostIP{{IP: p.nodeIP}}
	}
	now := metav1.Now()
	st.StartTime = &now
	p.publish(pod.UID, st)
}
