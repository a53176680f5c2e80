package netpol

import (
	"cmp"
	"math/bits"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// state is one consistent view of the cluster for a computation.
type state struct {
	pods       []*corev1.Pod // every pod of the cluster
	namespaces map[string]labels.Set
	policies   []*networkingv1.NetworkPolicy
}

// podAddr is a pod's IPv4 address when it is one policies apply to: an
// address of its own (not the node's network) and not finished.
func podAddr(p *corev1.Pod) (netip.Addr, bool) {
	if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return netip.Addr{}, false
	}
	ips := []string{p.Status.PodIP}
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// policyTypes are the directions a policy isolates, defaulted as upstream:
// Ingress always, Egress when it has egress rules.
func policyTypes(np *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(s)
}

// compute returns the policy of every pod on node that has an address of
// its own, keyed by UID. A policy whose selectors do not parse is left
// out, and reported through bad.
func compute(node string, st state, bad func(np *networkingv1.NetworkPolicy, err error)) map[string]Policy {
	policies := slices.Clone(st.policies)
	slices.SortFunc(policies, func(a, b *networkingv1.NetworkPolicy) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	r := resolver{st: st, matched: map[*networkingv1.NetworkPolicyPeer][]*corev1.Pod{}}
	out := map[string]Policy{}
	for _, pod := range st.pods {
		if pod.Spec.NodeName != node {
			continue
		}
		if _, ok := podAddr(pod); !ok {
			continue
		}
		var pol Policy
		for _, np := range policies {
			if np.Namespace != pod.Namespace {
				continue
			}
			sel, err := selector(&np.Spec.PodSelector)
			if err != nil {
				if bad != nil {
					bad(np, err)
				}
				continue
			}
			if !sel.Matches(labels.Set(pod.Labels)) {
				continue
			}
			ingress, egress := policyTypes(np)
			if ingress {
				pol.Ingress.Isolated = true
				for i := range np.Spec.Ingress {
					pol.Ingress.Rules = append(pol.Ingress.Rules, r.ingressRules(np, &np.Spec.Ingress[i], pod)...)
				}
			}
			if egress {
				pol.Egress.Isolated = true
				for i := range np.Spec.Egress {
					pol.Egress.Rules = append(pol.Egress.Rules, r.egressRules(np, &np.Spec.Egress[i])...)
				}
			}
		}
		pol.Ingress.simplify()
		pol.Egress.simplify()
		out[string(pod.UID)] = pol
	}
	return out
}

// simplify: a rule that allows everything makes the others moot.
func (d *Direction) simplify() {
	if slices.ContainsFunc(d.Rules, func(r Rule) bool { return r.Peers == nil && r.Ports == nil }) {
		d.Rules = []Rule{{}}
	}
}

// resolver turns peers into addresses, remembering which pods a peer
// selected: every local pod a policy selects shares the work.
type resolver struct {
	st      state
	matched map[*networkingv1.NetworkPolicyPeer][]*corev1.Pod
}

// pods returns the live pods a selector peer selects; nil for an ipBlock.
func (r *resolver) pods(np *networkingv1.NetworkPolicy, peer *networkingv1.NetworkPolicyPeer) []*corev1.Pod {
	if peer.IPBlock != nil {
		return nil
	}
	if m, ok := r.matched[peer]; ok {
		return m
	}
	var out []*corev1.Pod
	podSel, err1 := selector(peer.PodSelector)
	nsSel, err2 := selector(peer.NamespaceSelector)
	if err1 == nil && err2 == nil {
		for _, p := range r.st.pods {
			if _, ok := podAddr(p); !ok || !podSel.Matches(labels.Set(p.Labels)) {
				continue
			}
			// Without a namespaceSelector, only the policy's namespace.
			if peer.NamespaceSelector == nil && p.Namespace != np.Namespace {
				continue
			}
			if peer.NamespaceSelector != nil {
				ls, ok := r.st.namespaces[p.Namespace]
				if !ok || !nsSel.Matches(ls) {
					continue
				}
			}
			out = append(out, p)
		}
	}
	r.matched[peer] = out
	return out
}

// ipBlock is the peer of an IPv4 ipBlock; false for IPv6 (the pod network
// is IPv4: such a block never matches) or one that does not parse.
func ipBlock(b *networkingv1.IPBlock) (Peer, bool) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !cidr.Addr().Is4() {
		return Peer{}, false
	}
	p := Peer{CIDR: cidr.Masked()}
	for _, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil || !ex.Addr().Is4() {
			continue
		}
		ex = ex.Masked()
		if ex.Bits() < p.CIDR.Bits() {
			if ex.Contains(p.CIDR.Addr()) {
				return Peer{}, false // the whole block is excepted
			}
			continue
		}
		if p.CIDR.Contains(ex.Addr()) {
			p.Except = append(p.Except, ex)
		}
	}
	return p, true
}

// peers resolves a rule's peers; empty means it selects nothing (a rule
// without peers is "any", which callers handle before).
func (r *resolver) peers(np *networkingv1.NetworkPolicy, peers []networkingv1.NetworkPolicyPeer) []Peer {
	var out []Peer
	var addrs []netip.Addr
	for i := range peers {
		if b := peers[i].IPBlock; b != nil {
			if p, ok := ipBlock(b); ok {
				out = append(out, p)
			}
			continue
		}
		for _, p := range r.pods(np, &peers[i]) {
			a, _ := podAddr(p)
			addrs = append(addrs, a)
		}
	}
	for _, p := range collapse(addrs) {
		out = append(out, Peer{CIDR: p})
	}
	return out
}

func (r *resolver) ingressRules(np *networkingv1.NetworkPolicy, rule *networkingv1.NetworkPolicyIngressRule, target *corev1.Pod) []Rule {
	var out Rule
	if len(rule.From) > 0 {
		if out.Peers = r.peers(np, rule.From); len(out.Peers) == 0 {
			return nil
		}
	}
	if len(rule.Ports) > 0 {
		for _, p := range rule.Ports {
			out.Ports = append(out.Ports, resolvePort(p, target)...)
		}
		if len(out.Ports) == 0 {
			return nil // only named ports the pod does not have
		}
	}
	return []Rule{out}
}

// egressRules: numeric ports apply to every peer alike; a named port means
// a different number on each peer pod, so it becomes one rule per peer pod
// that has it (pods selected, or inside an ipBlock of the rule, or any pod
// when the rule has no peers).
func (r *resolver) egressRules(np *networkingv1.NetworkPolicy, rule *networkingv1.NetworkPolicyEgressRule) []Rule {
	var peers []Peer
	if len(rule.To) > 0 {
		if peers = r.peers(np, rule.To); len(peers) == 0 {
			return nil
		}
	}
	if len(rule.Ports) == 0 {
		return []Rule{{Peers: peers}}
	}
	var numeric []Port
	var named []networkingv1.NetworkPolicyPort
	for _, p := range rule.Ports {
		if p.Port != nil && p.Port.Type == intstr.String {
			named = append(named, p)
			continue
		}
		numeric = append(numeric, resolvePort(p, nil)...)
	}
	var out []Rule
	if len(numeric) > 0 {
		out = append(out, Rule{Peers: peers, Ports: numeric})
	}
	if len(named) == 0 {
		return out
	}
	for _, pod := range r.namedPortPeers(np, rule.To) {
		var ports []Port
		for _, p := range named {
			ports = append(ports, resolvePort(p, pod)...)
		}
		if len(ports) > 0 {
			a, _ := podAddr(pod)
			out = append(out, Rule{Peers: []Peer{{CIDR: netip.PrefixFrom(a, 32)}}, Ports: ports})
		}
	}
	return out
}

// namedPortPeers are the pods a rule's peers take in, in address order.
func (r *resolver) namedPortPeers(np *networkingv1.NetworkPolicy, to []networkingv1.NetworkPolicyPeer) []*corev1.Pod {
	seen := map[*corev1.Pod]bool{}
	var out []*corev1.Pod
	add := func(p *corev1.Pod) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, p := range r.st.pods {
		if _, ok := podAddr(p); ok && len(to) == 0 {
			add(p)
		}
	}
	for i := range to {
		if b := to[i].IPBlock; b != nil {
			blk, ok := ipBlock(b)
			if !ok {
				continue
			}
			for _, p := range r.st.pods {
				if a, ok := podAddr(p); ok && blk.CIDR.Contains(a) && !slices.ContainsFunc(blk.Except, func(e netip.Prefix) bool { return e.Contains(a) }) {
					add(p)
				}
			}
			continue
		}
		for _, p := range r.pods(np, &to[i]) {
			add(p)
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		x, _ := podAddr(a)
		y, _ := podAddr(b)
		return x.Compare(y)
	})
	return out
}

// resolvePort turns a policy port into numbers: a named port against the
// pod's container ports of that name and protocol (nothing when pod is
// nil or has none).
func resolvePort(p networkingv1.NetworkPolicyPort, pod *corev1.Pod) []Port {
	proto := corev1.ProtocolTCP
	if p.Protocol != nil {
		proto = *p.Protocol
	}
	if p.Port == nil {
		return []Port{{Protocol: proto}}
	}
	if p.Port.Type == intstr.Int {
		n := p.Port.IntVal
		if n < 1 || n > 65535 {
			return nil
		}
		out := Port{Protocol: proto, Port: uint16(n)}
		if p.EndPort != nil && *p.EndPort > n && *p.EndPort <= 65535 {
			out.EndPort = uint16(*p.EndPort)
		}
		return []Port{out}
	}
	if pod == nil {
		return nil
	}
	var out []Port
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for _, cp := range c.Ports {
				cproto := cp.Protocol
				if cproto == "" {
					cproto = corev1.ProtocolTCP
				}
				if cp.Name == p.Port.StrVal && cproto == proto && cp.ContainerPort > 0 && cp.ContainerPort <= 65535 {
					out = append(out, Port{Protocol: proto, Port: uint16(cp.ContainerPort)})
				}
			}
		}
	}
	return out
}

// collapse turns addresses into the fewest prefixes covering exactly
// them: pod addresses are handed out in order, so the peers of a broad
// selector fit in a few prefixes instead of one /32 each.
func collapse(addrs []netip.Addr) []netip.Prefix {
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	var out []netip.Prefix
	for i := 0; i < len(addrs); {
		j := i
		for j+1 < len(addrs) && num(addrs[j+1]) == num(addrs[j])+1 {
			j++
		}
		out = append(out, rangePrefixes(num(addrs[i]), num(addrs[j]))...)
		i = j + 1
	}
	return out
}

func num(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// rangePrefixes covers lo..hi exactly with aligned prefixes.
func rangePrefixes(lo, hi uint32) []netip.Prefix {
	var out []netip.Prefix
	for {
		// The largest block aligned at lo that stays within hi.
		size := 32
		if lo != 0 {
			size = bits.TrailingZeros32(lo)
		}
		for size > 0 && uint64(lo)+(uint64(1)<<size)-1 > uint64(hi) {
			size--
		}
		a := netip.AddrFrom4([4]byte{byte(lo >> 24), byte(lo >> 16), byte(lo >> 8), byte(lo)})
		out = append(out, netip.PrefixFrom(a, 32-size))
		end := uint64(lo) + (uint64(1) << size) - 1
		if end >= uint64(hi) {
			return out
		}
		lo = uint32(end + 1)
	}
}
