package wire

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"regexp"
)

// The mesh verbs: a WireGuard device netd owns, whose peers are the other
// nodes. The node's private key is made by netd and kept in a root-owned
// file netd alone reads; requests name it by KeyRef and responses carry
// only the public key, so no frame ever holds a private key.
const (
	VerbConfigureMesh Verb = "ConfigureMesh"
	VerbSetMeshPeers  Verb = "SetMeshPeers"
	VerbMeshStatus    Verb = "MeshStatus"
	VerbRemoveMesh    Verb = "RemoveMesh"
)

// MeshMTU is the mesh device's MTU: 1500 less WireGuard's 60 bytes over
// IPv4 (80 over IPv6) and 40 more for an underlay that is itself a tunnel
// or PPPoE link (a Mac on a VPN, a home uplink), so a full-size pod packet
// is never fragmented on the way.
const MeshMTU = 1380

// MeshKeepalive is every peer's persistent keepalive, in seconds: it
// keeps NAT and firewall state open between nodes that are both behind
// one.
const MeshKeepalive = 25

// MaxMeshPeers bounds SetMeshPeers: a full set must fit in one MaxFrame.
const MaxMeshPeers = 250

// ConfigureMeshArgs brings up the node's mesh device (idempotent). It
// needs Configure first: the node's pod range is its allowed range at the
// peers, and its gateway the device's address.
type ConfigureMeshArgs struct {
	// KeyRef names the node's private key: netd keeps it in a file of its
	// own key directory, made (0600) at the first ConfigureMesh that names
	// it, and never sends it. [a-z0-9-], 1 to 32 characters.
	KeyRef string `json:"keyRef"`
	// ListenPort is the UDP port peers send to (1 to 65535).
	ListenPort uint16 `json:"listenPort"`
}

// SetMeshPeersArgs replaces the whole set of peers (none: no peers).
type SetMeshPeersArgs struct {
	Peers []MeshPeer `json:"peers,omitempty"`
}

// MeshPeer is another node: its public key, where it listens and its pod
// range, which is both the peer's allowed range and the route netd adds
// through the device. PodCIDR must lie inside the cluster range and not
// overlap the node's own range or another peer's.
type MeshPeer struct {
	PublicKey string `json:"publicKey"` // base64 of 32 bytes
	Endpoint  string `json:"endpoint"`  // IP:port (IPv4, or [IPv6]:port)
	PodCIDR   string `json:"podCIDR"`
}

// MeshResult is the mesh device's state: ConfigureMesh, SetMeshPeers and
// MeshStatus answer with it.
type MeshResult struct {
	Device     string           `json:"device"`
	PublicKey  string           `json:"publicKey"`
	ListenPort uint16           `json:"listenPort"`
	MTU        int              `json:"mtu"`
	Peers      []MeshPeerStatus `json:"peers,omitempty"`
}

// MeshPeerStatus is what the device knows of one peer.
type MeshPeerStatus struct {
	PublicKey string `json:"publicKey"`
	Endpoint  string `json:"endpoint,omitempty"`
	PodCIDR   string `json:"podCIDR"`
	// LastHandshake is the Unix time of the last completed handshake (0:
	// none yet).
	LastHandshake int64  `json:"lastHandshake,omitempty"`
	RxBytes       uint64 `json:"rxBytes,omitempty"`
	TxBytes       uint64 `json:"txBytes,omitempty"`
}

var keyRefRE = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)

// CheckConfigureMesh checks ConfigureMesh's arguments: a key name that is
// a plain file name in netd's key directory, and a port.
func CheckConfigureMesh(a *ConfigureMeshArgs) error {
	if !keyRefRE.MatchString(a.KeyRef) {
		return fmt.Errorf("keyRef: %q is not a key name ([a-z0-9-], 1 to 32 characters)", a.KeyRef)
	}
	if a.ListenPort == 0 {
		return fmt.Errorf("listenPort: 0 (want 1-65535)")
	}
	return nil
}

// ParsedMeshPeer is a MeshPeer ParseMeshPeers accepted.
type ParsedMeshPeer struct {
	PublicKey [32]byte
	Endpoint  netip.AddrPort
	PodCIDR   netip.Prefix
}

// ParseMeshPeers checks a SetMeshPeers: at most MaxMeshPeers, each with a
// public key (canonical base64 of 32 bytes), an endpoint (a canonical
// IP:port, port not 0, address neither unspecified nor multicast) and a
// pod range as ParsePodCIDR accepts a node's; no key twice and no two
// ranges overlapping.
func ParseMeshPeers(a *SetMeshPeersArgs) ([]ParsedMeshPeer, error) {
	// An empty list is left out: it would not survive a round trip.
	if a.Peers != nil && len(a.Peers) == 0 {
		return nil, fmt.Errorf("setMeshPeers: peers is an empty list (leave it out for no peers)")
	}
	if len(a.Peers) > MaxMeshPeers {
		return nil, fmt.Errorf("setMeshPeers: %d peers, at most %d", len(a.Peers), MaxMeshPeers)
	}
	out := make([]ParsedMeshPeer, 0, len(a.Peers))
	keys := map[[32]byte]int{}
	for i, p := range a.Peers {
		key, err := ParseMeshKey(p.PublicKey)
		if err != nil {
			return nil, fmt.Errorf("setMeshPeers: peer %d: publicKey: %w", i, err)
		}
		if j, dup := keys[key]; dup {
			return nil, fmt.Errorf("setMeshPeers: peer %d: publicKey %s is peer %d's too", i, p.PublicKey, j)
		}
		keys[key] = i
		ep, err := ParseMeshEndpoint(p.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("setMeshPeers: peer %d: endpoint: %w", i, err)
		}
		cidr, err := ParsePodCIDR(p.PodCIDR)
		if err != nil {
			return nil, fmt.Errorf("setMeshPeers: peer %d: %w", i, err)
		}
		for j, q := range out {
			if q.PodCIDR.Overlaps(cidr) {
				return nil, fmt.Errorf("setMeshPeers: peer %d: podCIDR %s overlaps peer %d's %s", i, cidr, j, q.PodCIDR)
			}
		}
		out = append(out, ParsedMeshPeer{PublicKey: key, Endpoint: ep, PodCIDR: cidr})
	}
	return out, nil
}

// ParseMeshKey decodes a WireGuard public key: standard base64 with
// padding of exactly 32 bytes, in canonical form (so one key has one
// spelling, and duplicates are found by text as well as by value).
func ParseMeshKey(s string) ([32]byte, error) {
	var k [32]byte
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	switch {
	case err != nil:
		return k, fmt.Errorf("%q is not base64: %v", s, err)
	case len(b) != len(k):
		return k, fmt.Errorf("%q is %d bytes, a key is %d", s, len(b), len(k))
	case base64.StdEncoding.EncodeToString(b) != s:
		return k, fmt.Errorf("%q is not in canonical base64", s)
	}
	copy(k[:], b)
	return k, nil
}

// ParseMeshEndpoint parses where a peer listens: IPv4:port or
// [IPv6]:port in canonical form, no zone, port 1-65535, an address that
// can be sent to (not unspecified, not multicast).
func ParseMeshEndpoint(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	switch {
	case err != nil:
		return ap, fmt.Errorf("%q is not IP:port (want e.g. 192.0.2.10:51820 or [2001:db8::1]:51820): %v", s, err)
	case ap.String() != s:
		return ap, fmt.Errorf("%q is not in canonical form (want %s)", s, ap)
	case ap.Addr().Zone() != "" || ap.Addr().Is4In6():
		return ap, fmt.Errorf("%s: an address with a zone or an IPv4-mapped IPv6 address is not an endpoint", s)
	case ap.Port() == 0:
		return ap, fmt.Errorf("%s: port 0 (want 1-65535)", s)
	case ap.Addr().IsUnspecified() || ap.Addr().IsMulticast():
		return ap, fmt.Errorf("%s: %s cannot be sent to", s, ap.Addr())
	}
	return ap, nil
}
