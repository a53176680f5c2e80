package podspec

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/k3sm-dev/k3sm/internal/agent/resolvconf"
)

// DNS is the cluster DNS a node gives its pods through /etc/resolv.conf.
type DNS struct {
	// Server is the --cluster-dns address, Domain the cluster domain.
	Server, Domain string
	// HostResolvConf is the node's resolver configuration for dnsPolicy
	// Default and the search path after the cluster's (default
	// /etc/resolv.conf; on a systemd-resolved host whose stub listens on
	// 127.0.0.53, /run/systemd/resolve/resolv.conf lists the real servers).
	HostResolvConf string
}

// The kubelet's limits on what a pod's resolv.conf may carry.
const (
	maxDNSNameservers = 3
	maxDNSSearch      = 32
)

type resolvConf struct {
	nameservers, searches []string
	options               []string // "name" or "name:value"
}

// readHostResolvConf reads the node's resolver configuration. Loopback
// nameservers are dropped: inside a pod's own network, 127.0.0.53 is the
// pod's loopback, not the node's stub resolver.
func readHostResolvConf(path string) (resolvConf, error) {
	f, err := resolvconf.Read(path)
	if err != nil {
		return resolvConf{}, err
	}
	rc := resolvConf{searches: f.Search, options: f.Options}
	for _, n := range f.Nameservers {
		if a, err := netip.ParseAddr(n); err == nil && !a.IsLoopback() {
			rc.nameservers = append(rc.nameservers, n)
		}
	}
	return rc, nil
}

// HostResolvConfPath picks the file with the node's real resolvers: the
// systemd-resolved list when /etc/resolv.conf names only its loopback stub.
func HostResolvConfPath() string {
	const etc, resolved = "/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"
	if rc, err := readHostResolvConf(etc); err == nil && len(rc.nameservers) == 0 {
		if _, err := os.Stat(resolved); err == nil {
			return resolved
		}
	}
	return etc
}

// ResolvConf renders the pod's /etc/resolv.conf as the kubelet does for its
// dnsPolicy and dnsConfig; "" when the pod keeps the node's own file (no
// cluster DNS on this node). ownNetwork: the pod has a network of its own.
func ResolvConf(pod *corev1.Pod, d *DNS) (string, error) {
	if d == nil {
		return "", nil
	}
	host, err := readHostResolvConf(d.HostResolvConf)
	if err != nil && pod.Spec.DNSPolicy != corev1.DNSNone {
		return "", fmt.Errorf("dnsPolicy %s needs the node's resolver configuration: %w", pod.Spec.DNSPolicy, err)
	}
	var rc resolvConf
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	if policy == corev1.DNSClusterFirst && pod.Spec.HostNetwork {
		policy = corev1.DNSDefault // ClusterFirst on the host network means Default
	}
	switch policy {
	case corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet:
		ns := pod.Namespace
		if ns == "" {
			ns = "default"
		}
		rc.nameservers = []string{d.Server}
		rc.searches = append([]string{ns + ".svc." + d.Domain, "svc." + d.Domain, d.Domain}, host.searches...)
		rc.options = []string{"ndots:5"}
	case corev1.DNSDefault:
		rc = host
	case corev1.DNSNone:
		if pod.Spec.DNSConfig == nil {
			return "", fmt.Errorf("spec.dnsConfig: dnsPolicy None needs a dnsConfig")
		}
	default:
		return "", fmt.Errorf("spec.dnsPolicy %q: use ClusterFirst, ClusterFirstWithHostNet, Default or None", pod.Spec.DNSPolicy)
	}
	if c := pod.Spec.DNSConfig; c != nil {
		rc.nameservers = append(rc.nameservers, c.Nameservers...)
		rc.searches = append(rc.searches, c.Searches...)
		for _, o := range c.Options {
			v := o.Name
			if o.Value != nil {
				v += ":" + *o.Value
			}
			// A pod's option replaces the same option from the policy.
			rc.options = slices.DeleteFunc(rc.options, func(x string) bool { n, _, _ := strings.Cut(x, ":"); return n == o.Name })
			rc.options = append(rc.options, v)
		}
	}
	rc.nameservers = dedup(rc.nameservers)
	rc.searches = dedup(rc.searches)
	if len(rc.nameservers) > maxDNSNameservers {
		rc.nameservers = rc.nameservers[:maxDNSNameservers]
	}
	if len(rc.searches) > maxDNSSearch {
		rc.searches = rc.searches[:maxDNSSearch]
	}
	var b strings.Builder
	for _, n := range rc.nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", n)
	}
	if len(rc.searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(rc.searches, " "))
	}
	if len(rc.options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(rc.options, " "))
	}
	return b.String(), nil
}

func dedup(l []string) []string {
	var out []string
	for _, s := range l {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
