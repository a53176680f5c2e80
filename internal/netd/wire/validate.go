package wire

import (
	"fmt"
	"net/netip"
	"regexp"
)

var (
	uidRE = regexp.MustCompile(`^[0-9a-f][0-9a-f-]{0,63}$`)
	// DNS-1123 label and subdomain, as Kubernetes validates namespaces and
	// pod names.
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
	for _, set := range []bool{r.Configure != nil, r.SetupPod != nil, r.TeardownPod != nil, r.SetPolicy != nil} {
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
	case VerbListPods:
		if n != 0 {
			return fmt.Errorf("verb ListPods takes no arguments")
		}
		return nil
	default:
		return fmt.Errorf("verb: %q is not one of Configure, SetupPod, TeardownPod, ListPods, SetPolicy", r.Verb)
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
