package wire

import (
	"fmt"
	"net/netip"
	"regexp"
)

var (
	uidRE = regexp.MustCompile(`^[0-9a-f][0-9a-f-]{0,63}$`)
	// DNS-1123 label and subdomain, as Kubernetes validates namespaces and
	// pod names. Written here rather than taken from apimachinery's
	// validation: k3sm-netd runs as root and links nothing of Kubernetes
	// (TestNetdStaysSmall in internal/architecture).
	labelRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	subdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// Ranges a pod CIDR may not touch: the host's own, "this network" and
// multicast.
var reserved = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("224.0.0.0/4"),
}

// Validate checks r completely: version, verb, that exactly the verb's
// arguments are present, and every field.
func (r *Request) Validate() error {
	if r.Version != Version {
		return fmt.Errorf("version: got %d, k3sm-netd speaks %d (run k3sm and k3sm-netd of the same release)", r.Version, Version)
	}
	n := 0
	for _, set := range []bool{r.Configure != nil, r.SetupPod != nil, r.TeardownPod != nil, r.SetPolicy != nil, r.SetServices != nil,
		r.ConfigureMesh != nil, r.SetMeshPeers != nil} {
		if set {
			n++
		}
	}
	want := func(field string, present bool) error {
		if !present || n != 1 {
			return fmt.Errorf("verb %s takes exactly its %q arguments and no others", r.Verb, field)
		}
		return nil
	}
	switch r.Verb {
	case VerbConfigure:
		if err := want("configure", r.Configure != nil); err != nil {
			return err
		}
		_, _, _, err := ParseRanges(r.Configure)
		return err
	case VerbSetupPod:
		if err := want("setupPod", r.SetupPod != nil); err != nil {
			return err
		}
		a := r.SetupPod
		if err := CheckUID(a.UID); err != nil {
			return err
		}
		if err := CheckNamespace(a.Namespace); err != nil {
			return err
		}
		if a.FromPid < 0 || a.FromPid > 1<<22 {
			return fmt.Errorf("fromPid: %d is not a process id (1 to 4194304, or 0 for a namespace netd makes)", a.FromPid)
		}
		return CheckName(a.Name)
	case VerbTeardownPod:
		if err := want("teardownPod", r.TeardownPod != nil); err != nil {
			return err
		}
		return CheckUID(r.TeardownPod.UID)
	case VerbSetPolicy:
		if err := want("setPolicy", r.SetPolicy != nil); err != nil {
			return err
		}
		if err := CheckUID(r.SetPolicy.UID); err != nil {
			return err
		}
		if err := CheckPolicyDirection("ingress", r.SetPolicy.Ingress); err != nil {
			return err
		}
		return CheckPolicyDirection("egress", r.SetPolicy.Egress)
	case VerbSetServices:
		if err := want("setServices", r.SetServices != nil); err != nil {
			return err
		}
		return CheckSetServices(r.SetServices)
	case VerbConfigureMesh:
		if err := want("configureMesh", r.ConfigureMesh != nil); err != nil {
			return err
		}
		return CheckConfigureMesh(r.ConfigureMesh)
	case VerbSetMeshPeers:
		if err := want("setMeshPeers", r.SetMeshPeers != nil); err != nil {
			return err
		}
		_, err := ParseMeshPeers(r.SetMeshPeers)
		return err
	case VerbListPods, VerbMeshStatus, VerbRemoveMesh:
		if n != 0 {
			return fmt.Errorf("verb %s takes no arguments", r.Verb)
		}
		return nil
	default:
		return fmt.Errorf("verb: %q is not one of Configure, SetupPod, TeardownPod, ListPods, SetPolicy, SetServices, ConfigureMesh, SetMeshPeers, MeshStatus, RemoveMesh", r.Verb)
	}
}

// CheckUID accepts a Kubernetes pod UID: lowercase hex and dashes, at most 64.
func CheckUID(uid string) error {
	if !uidRE.MatchString(uid) {
		return fmt.Errorf("uid: %q is not a pod UID (lowercase hex digits and dashes, starting with a hex digit, at most 64)", uid)
	}
	return nil
}

// CheckNamespace accepts a DNS-1123 label.
func CheckNamespace(ns string) error {
	if len(ns) > 63 || !labelRE.MatchString(ns) {
		return fmt.Errorf("namespace: %q is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending alphanumeric, at most 63)", ns)
	}
	return nil
}

// CheckName accepts a DNS-1123 subdomain.
func CheckName(name string) error {
	if len(name) > 253 || !subdomainRE.MatchString(name) {
		return fmt.Errorf("name: %q is not a DNS-1123 subdomain (dot-separated lowercase labels, at most 253)", name)
	}
	return nil
}

// ParsePodCIDR parses a node's pod range: IPv4, no host bits, /16 to /28,
// clear of loopback, 0.0.0.0/8 and multicast.
func ParsePodCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("podCIDR: %q is not a CIDR (want e.g. 10.42.0.0/24): %v", s, err)
	}
	if !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("podCIDR: %s is not IPv4 (the pod network is IPv4 only)", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("podCIDR: %s has host bits set (did you mean %s?)", s, p.Masked())
	}
	if p.Bits() < 16 || p.Bits() > 28 {
		return netip.Prefix{}, fmt.Errorf("podCIDR: %s is a /%d; a node's range is /16 to /28", s, p.Bits())
	}
	for _, r := range reserved {
		if p.Overlaps(r) {
			return netip.Prefix{}, fmt.Errorf("podCIDR: %s overlaps the reserved %s; choose another range", s, r)
		}
	}
	return p, nil
}

// ParseRanges parses and cross-checks Configure's ranges: the pod range as
// ParsePodCIDR, the optional Service and cluster ranges IPv4, masked, /8 or
// longer, clear of the reserved ranges; the cluster range contains the pod
// range; the Service range overlaps neither.
func ParseRanges(a *ConfigureArgs) (pod, svc, cluster netip.Prefix, err error) {
	if pod, err = ParsePodCIDR(a.PodCIDR); err != nil {
		return
	}
	parse := func(field, s string) (netip.Prefix, error) {
		if s == "" {
			return netip.Prefix{}, nil
		}
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			return p, fmt.Errorf("%s: %q is not a CIDR (want e.g. 10.43.0.0/16): %v", field, s, err)
		case !p.Addr().Is4():
			return p, fmt.Errorf("%s: %s is not IPv4", field, s)
		case p.Masked() != p:
			return p, fmt.Errorf("%s: %s has host bits set (did you mean %s?)", field, s, p.Masked())
		case p.Bits() < 8:
			return p, fmt.Errorf("%s: %s is larger than a /8", field, s)
		}
		for _, r := range reserved {
			if p.Overlaps(r) {
				return p, fmt.Errorf("%s: %s overlaps the reserved %s; choose another range", field, s, r)
			}
		}
		return p, nil
	}
	if svc, err = parse("serviceCIDR", a.ServiceCIDR); err != nil {
		return
	}
	if cluster, err = parse("clusterCIDR", a.ClusterCIDR); err != nil {
		return
	}
	if cluster.IsValid() && (!cluster.Contains(pod.Addr()) || cluster.Bits() > pod.Bits()) {
		return pod, svc, cluster, fmt.Errorf("clusterCIDR: %s does not contain the podCIDR %s", cluster, pod)
	}
	if svc.IsValid() && (svc.Overlaps(pod) || (cluster.IsValid() && svc.Overlaps(cluster))) {
		return pod, svc, cluster, fmt.Errorf("serviceCIDR: %s overlaps the pod ranges", svc)
	}
	return pod, svc, cluster, nil
}

// Bounds of one direction of a SetPolicy, on top of MaxFrame: what the
// root process builds rules from stays small whatever a client sends.
const (
	MaxPolicyRules   = 256  // rules of one direction
	MaxPolicyPeers   = 4096 // peers of one direction, all rules together
	MaxPolicyExcepts = 64   // exceptions of one peer
	MaxPolicyPorts   = 64   // ports of one rule
)

// CheckPolicyDirection checks one side of a SetPolicy: within the bounds,
// rules only when isolated, peers masked IPv4 CIDRs with exceptions inside
// them, ports of TCP, UDP or SCTP with ranges that run forward.
func CheckPolicyDirection(side string, d PolicyDirection) error {
	if !d.Isolated && len(d.Rules) > 0 {
		return fmt.Errorf("%s: rules without isolation (a side that is not isolated allows everything)", side)
	}
	// An empty list is left out: it would not survive a round trip.
	if d.Rules != nil && len(d.Rules) == 0 {
		return fmt.Errorf("%s: rules is an empty list (leave it out)", side)
	}
	if len(d.Rules) > MaxPolicyRules {
		return fmt.Errorf("%s: %d rules, at most %d", side, len(d.Rules), MaxPolicyRules)
	}
	peers := 0
	for i, r := range d.Rules {
		if peers += len(r.Peers); peers > MaxPolicyPeers {
			return fmt.Errorf("%s: more than %d peers", side, MaxPolicyPeers)
		}
		if (r.Peers != nil && len(r.Peers) == 0) || (r.Ports != nil && len(r.Ports) == 0) {
			return fmt.Errorf("%s rule %d: an empty list of peers or ports (leave it out: absent means any)", side, i)
		}
		if len(r.Ports) > MaxPolicyPorts {
			return fmt.Errorf("%s rule %d: %d ports, at most %d", side, i, len(r.Ports), MaxPolicyPorts)
		}
		for _, p := range r.Peers {
			cidr, err := ParsePolicyCIDR(p.CIDR)
			if err != nil {
				return fmt.Errorf("%s rule %d: %w", side, i, err)
			}
			if p.Except != nil && len(p.Except) == 0 {
				return fmt.Errorf("%s rule %d: peer %s: except is an empty list (leave it out)", side, i, p.CIDR)
			}
			if len(p.Except) > MaxPolicyExcepts {
				return fmt.Errorf("%s rule %d: peer %s has %d exceptions, at most %d", side, i, p.CIDR, len(p.Except), MaxPolicyExcepts)
			}
			for _, e := range p.Except {
				ex, err := ParsePolicyCIDR(e)
				if err != nil {
					return fmt.Errorf("%s rule %d: except: %w", side, i, err)
				}
				if ex.Bits() < cidr.Bits() || !cidr.Contains(ex.Addr()) {
					return fmt.Errorf("%s rule %d: except %s is not inside %s", side, i, e, p.CIDR)
				}
			}
		}
		for _, p := range r.Ports {
			if _, err := ParsePolicyProtocol(p.Protocol); err != nil {
				return fmt.Errorf("%s rule %d: %w", side, i, err)
			}
			if p.EndPort != 0 && (p.Port == 0 || p.EndPort < p.Port) {
				return fmt.Errorf("%s rule %d: port range %d-%d (endPort needs a port at or below it)", side, i, p.Port, p.EndPort)
			}
		}
	}
	return nil
}

// ParsePolicyCIDR parses a peer's CIDR: IPv4 without host bits.
func ParsePolicyCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		return p, fmt.Errorf("peer %q is not a CIDR: %v", s, err)
	case !p.Addr().Is4():
		return p, fmt.Errorf("peer %s is not IPv4 (the pod network is IPv4 only)", s)
	case p.Masked() != p:
		return p, fmt.Errorf("peer %s has host bits set (did you mean %s?)", s, p.Masked())
	}
	return p, nil
}

// ParsePolicyProtocol returns the IP protocol number of "TCP", "UDP" or "SCTP".
func ParsePolicyProtocol(s string) (uint8, error) {
	switch s {
	case "TCP":
		return 6, nil
	case "UDP":
		return 17, nil
	case "SCTP":
		return 132, nil
	}
	return 0, fmt.Errorf("protocol %q is not TCP, UDP or SCTP", s)
}

// Bounds of SetServices, on top of MaxFrame: what netd holds between
// chunks and builds one transaction from stays bounded.
const (
	MaxServiceChunks    = 256   // chunks of one generation
	MaxServicePorts     = 16384 // Service ports of one generation, all chunks together
	MaxServiceEndpoints = 1000  // endpoints of one Service port (1000 fit in one frame)
	// MaxServiceEndpointsTotal bounds the endpoints of one generation:
	// each is an nftables chain in the one transaction.
	MaxServiceEndpointsTotal = 65536
)

// CheckSetServices checks one chunk: its index, and every Service port
// (TCP or UDP, an IPv4 address clear of the reserved ranges, and of the
// link-local and class E ranges when external, a port)
// and endpoint (the same), no Service port or endpoint twice.
func CheckSetServices(a *SetServicesArgs) error {
	if a.Chunk < 0 || a.Chunk >= MaxServiceChunks {
		return fmt.Errorf("setServices: chunk %d is not within 0..%d", a.Chunk, MaxServiceChunks-1)
	}
	if a.Services != nil && len(a.Services) == 0 {
		return fmt.Errorf("setServices: services is an empty list (leave it out)")
	}
	if len(a.Services) > MaxServicePorts {
		return fmt.Errorf("setServices: %d Service ports in one chunk, at most %d", len(a.Services), MaxServicePorts)
	}
	seen := map[string]bool{}
	for i, s := range a.Services {
		if _, err := ParseServiceProtocol(s.Protocol); err != nil {
			return fmt.Errorf("setServices: service %d: %w", i, err)
		}
		ip, err := ParseServiceAddr("ip", s.IP)
		if err == nil && (s.External || s.NodePort || s.LoadBalancer) {
			err = checkExternalAddr(ip)
		}
		if err != nil {
			return fmt.Errorf("setServices: service %d: %w", i, err)
		}
		if s.Port == 0 {
			return fmt.Errorf("setServices: service %d (%s): port 0 (want 1-65535)", i, s.IP)
		}
		kinds := 0
		for _, k := range []bool{s.External, s.NodePort, s.LoadBalancer} {
			if k {
				kinds++
			}
		}
		if kinds > 1 {
			return fmt.Errorf("setServices: service %d (%s): at most one of external, nodePort and loadBalancer", i, s.IP)
		}
		if s.NodePort && (s.Port < NodePortMin || s.Port > NodePortMax) {
			return fmt.Errorf("setServices: service %d (%s): node port %d is outside the node port range %d-%d", i, s.IP, s.Port, NodePortMin, NodePortMax)
		}
		if s.Local && kinds == 0 {
			return fmt.Errorf("setServices: service %d (%s): local (externalTrafficPolicy: Local) applies only to an external, nodePort or loadBalancer address", i, s.IP)
		}
		key := ServiceKey(s.Protocol, ip, s.Port)
		if seen[key] {
			return fmt.Errorf("setServices: service %d: %s twice in one chunk", i, key)
		}
		seen[key] = true
		if s.Endpoints != nil && len(s.Endpoints) == 0 {
			return fmt.Errorf("setServices: service %s: endpoints is an empty list (leave it out)", key)
		}
		if len(s.Endpoints) > MaxServiceEndpoints {
			return fmt.Errorf("setServices: service %s: %d endpoints, at most %d", key, len(s.Endpoints), MaxServiceEndpoints)
		}
		eps := map[netip.AddrPort]bool{}
		for _, e := range s.Endpoints {
			eip, err := ParseServiceAddr("endpoint ip", e.IP)
			if err != nil {
				return fmt.Errorf("setServices: service %s: %w", key, err)
			}
			if e.Port == 0 {
				return fmt.Errorf("setServices: service %s: endpoint %s port 0 (want 1-65535)", key, e.IP)
			}
			ap := netip.AddrPortFrom(eip, e.Port)
			if eps[ap] {
				return fmt.Errorf("setServices: service %s: endpoint %s twice", key, ap)
			}
			eps[ap] = true
		}
	}
	return nil
}

// ServiceKey names a Service port in errors and for duplicate checks.
func ServiceKey(proto string, ip netip.Addr, port uint16) string {
	return fmt.Sprintf("%s %s", proto, netip.AddrPortFrom(ip, port))
}

// ParseServiceAddr parses a ClusterIP or an endpoint's address: IPv4 in
// canonical form, clear of loopback, 0.0.0.0/8 and multicast.
func ParseServiceAddr(field, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return a, fmt.Errorf("%s %q is not an IP address: %v", field, s, err)
	case !a.Is4():
		return a, fmt.Errorf("%s %s is not IPv4 (the pod network is IPv4 only)", field, s)
	case a.String() != s:
		return a, fmt.Errorf("%s %q is not in canonical form (want %s)", field, s, a)
	}
	for _, r := range reserved {
		if r.Contains(a) {
			return a, fmt.Errorf("%s %s is inside the reserved %s", field, s, r)
		}
	}
	return a, nil
}

// Ranges an external Service address may not be, on top of reserved: no
// Service may take over the link-local range (cloud metadata at
// 169.254.169.254, link-local peers) nor the class E range with the
// limited broadcast address.
var externalReserved = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

func checkExternalAddr(ip netip.Addr) error {
	for _, r := range externalReserved {
		if r.Contains(ip) {
			return fmt.Errorf("ip %s (external) is inside the reserved %s; a Service's externalIPs may not take it over", ip, r)
		}
	}
	return nil
}

// The node port range: the apiserver's default --service-node-port-range,
// which k3sm does not change.
const (
	NodePortMin = 30000
	NodePortMax = 32767
)

// CheckServiceRange checks a Service address (sp.IP, valid as
// CheckSetServices checked it) against the node's ranges: never inside
// the pod or cluster range; outside the Service range (when the node has
// one) only when marked external, nodePort or loadBalancer. A Local port's
// endpoints are all inside the node's pod range: its replies are not
// masqueraded, so only a pod routed through this node answers them.
func CheckServiceRange(sp ServicePort, ip netip.Addr, pod, svc, cluster netip.Prefix) error {
	key := ServiceKey(sp.Protocol, ip, sp.Port)
	for _, r := range []struct {
		name string
		p    netip.Prefix
	}{{"podCIDR", pod}, {"clusterCIDR", cluster}} {
		if r.p.IsValid() && r.p.Contains(ip) {
			return fmt.Errorf("setServices: service %s: ip %s is inside the %s %s; a Service address cannot be a pod's", key, ip, r.name, r.p)
		}
	}
	if svc.IsValid() && !svc.Contains(ip) && !sp.External && !sp.NodePort && !sp.LoadBalancer {
		return fmt.Errorf("setServices: service %s: ip %s is outside the serviceCIDR %s; only an address of spec.externalIPs may be, sent with \"external\": true (or a node address, with \"nodePort\" or \"loadBalancer\")", key, ip, svc)
	}
	if sp.Local {
		for _, e := range sp.Endpoints {
			if eip, err := netip.ParseAddr(e.IP); err != nil || !pod.Contains(eip) {
				return fmt.Errorf("setServices: service %s: endpoint %s is outside the podCIDR %s; a local (externalTrafficPolicy: Local) port has only this node's pods", key, e.IP, pod)
			}
		}
	}
	return nil
}

// ParseServiceProtocol returns the IP protocol number of "TCP" or "UDP",
// the protocols the kernel Service path translates.
func ParseServiceProtocol(s string) (uint8, error) {
	switch s {
	case "TCP":
		return 6, nil
	case "UDP":
		return 17, nil
	}
	return 0, fmt.Errorf("protocol %q is not TCP or UDP", s)
}
