package v1

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ReachableWithin is how recent a peer's last handshake must be for it to
// count as reachable: WireGuard handshakes again every 2 minutes while
// packets flow, and the persistent keepalive keeps them flowing.
const ReachableWithin = 3 * time.Minute

// PublicKeyLen is the length of a public key in standard base64.
const PublicKeyLen = 44

// MeshIPOf returns the mesh address of a node with pod range podCIDR: the
// range's first host address (its pods' gateway).
func MeshIPOf(podCIDR netip.Prefix) netip.Addr { return podCIDR.Masked().Addr().Next() }

// NewSpec is the spec of node's MeshPeer: its public key, the endpoint its
// device listens on and its pod range (allowedIPs, meshIP and the
// keepalive follow from them).
func NewSpec(node, publicKey string, endpoint netip.AddrPort, podCIDR netip.Prefix) MeshPeerSpec {
	return MeshPeerSpec{
		NodeName:            node,
		PublicKey:           publicKey,
		Endpoint:            endpoint.String(),
		PodCIDR:             podCIDR.String(),
		AllowedIPs:          []string{podCIDR.String()},
		MeshIP:              MeshIPOf(podCIDR).String(),
		PersistentKeepalive: DefaultPersistentKeepalive,
	}
}

// ValidatePublicKey checks a WireGuard public key: standard base64 of 32
// bytes, with no stray bits in its last character.
func ValidatePublicKey(s string) error {
	if len(s) != PublicKeyLen {
		return fmt.Errorf("publicKey: %d characters, want %d (standard base64 of 32 bytes)", len(s), PublicKeyLen)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != 32 {
		return errors.New("publicKey: not standard base64 of 32 bytes")
	}
	return nil
}

// ParseEndpoint parses an endpoint: IPv4:port or [IPv6]:port, a port of 1
// to 65535, no zone and no IPv4-mapped IPv6 address (what k3sm-netd takes).
func ParseEndpoint(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return ap, fmt.Errorf("endpoint %q: want IPv4:port or [IPv6]:port", s)
	}
	if a := ap.Addr(); a.Zone() != "" || a.Is4In6() || !a.IsValid() || a.IsUnspecified() {
		return ap, fmt.Errorf("endpoint %q: want a specified address, without a zone, not IPv4-mapped", s)
	}
	if ap.Port() == 0 {
		return ap, fmt.Errorf("endpoint %q: port 0", s)
	}
	return ap, nil
}

// ParsePodCIDR parses a pod range: a CIDR with no host bits that has room
// for a mesh address.
func ParsePodCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil || p.Addr().Zone() != "" || p.Addr().Is4In6() {
		return p, fmt.Errorf("podCIDR %q: not a CIDR", s)
	}
	if p != p.Masked() {
		return p, fmt.Errorf("podCIDR %q: has host bits set (%s?)", s, p.Masked())
	}
	if !p.Contains(MeshIPOf(p)) {
		return p, fmt.Errorf("podCIDR %q: no room for a host address", s)
	}
	return p, nil
}

// ValidateSpec checks a spec: every field set and well-formed, allowedIPs
// == [podCIDR], meshIP the first host address of podCIDR.
func ValidateSpec(s *MeshPeerSpec) error {
	var errs []error
	if s.NodeName == "" {
		errs = append(errs, errors.New("nodeName: empty"))
	} else if msgs := validation.IsDNS1123Subdomain(s.NodeName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("nodeName %q: %s", s.NodeName, msgs[0]))
	}
	if err := ValidatePublicKey(s.PublicKey); err != nil {
		errs = append(errs, err)
	}
	if _, err := ParseEndpoint(s.Endpoint); err != nil {
		errs = append(errs, err)
	}
	cidr, err := ParsePodCIDR(s.PodCIDR)
	if err != nil {
		errs = append(errs, err)
	}
	if !slices.Equal(s.AllowedIPs, []string{s.PodCIDR}) {
		errs = append(errs, fmt.Errorf("allowedIPs %q: want [podCIDR] (%q)", s.AllowedIPs, s.PodCIDR))
	}
	if ip, perr := netip.ParseAddr(s.MeshIP); perr != nil {
		errs = append(errs, fmt.Errorf("meshIP %q: not an address", s.MeshIP))
	} else if err == nil && ip != MeshIPOf(cidr) {
		errs = append(errs, fmt.Errorf("meshIP %s: want podCIDR's first host address %s", ip, MeshIPOf(cidr)))
	}
	if s.PersistentKeepalive < 0 || s.PersistentKeepalive > 65535 {
		errs = append(errs, fmt.Errorf("persistentKeepalive %d: want 0 to 65535 seconds", s.PersistentKeepalive))
	}
	return errors.Join(errs...)
}

// Validate checks a MeshPeer: its name is its nodeName, and its spec is
// valid.
func Validate(p *MeshPeer) error {
	err := ValidateSpec(&p.Spec)
	if p.Name != p.Spec.NodeName {
		err = errors.Join(fmt.Errorf("metadata.name %q is not spec.nodeName %q", p.Name, p.Spec.NodeName), err)
	}
	return err
}
