package dataplane

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"
)

// Mesh is the node's WireGuard device: wireguard-go on a TUN device netd
// creates and owns (Linux: a tun link named Device; darwin: the next
// utun, whose name the kernel picks). Its address is the node's gateway
// (Node.Gateway), so traffic the node itself sends to a remote pod leaves
// with an address inside the node's own range, which the peers allow.
type Mesh struct {
	// Device is the link's name on Linux ("k3sm-wg"); ignored on darwin.
	Device string
	// PrivateKey is read by netd from its key file; it is handed to the
	// device and never logged or returned.
	PrivateKey PrivateKey
	ListenPort uint16
	// MTU of the device (wire.MeshMTU).
	MTU int
}

// MeshPeer is one other node: its allowed range is its pod range, which
// is routed through the device, so traffic is routed, not translated.
type MeshPeer struct {
	PublicKey [32]byte
	Endpoint  netip.AddrPort
	CIDR      netip.Prefix
	// Keepalive is the persistent keepalive (wire.MeshKeepalive seconds).
	Keepalive time.Duration
}

// MeshPeerStatus is what the device reports of one peer.
type MeshPeerStatus struct {
	PublicKey     [32]byte
	Endpoint      netip.AddrPort // as last seen (roaming)
	LastHandshake time.Time      // zero: none yet
	RxBytes       uint64
	TxBytes       uint64
}

// MeshPlane is the mesh part of a data path. Every method is idempotent.
type MeshPlane interface {
	// EnsureMesh creates the device (if this process has none), sets its
	// key, port and MTU, gives it n.Gateway, brings it up, and lets the
	// node forward between it and the bridge; pods' traffic to the peers
	// keeps its source address (no masquerade inside n.ClusterCIDR), and
	// the node's own traffic to them leaves from n.Gateway. It returns the
	// device's actual name.
	EnsureMesh(n Node, m Mesh) (string, error)
	// SetMeshPeers replaces the device's peers and the routes to their
	// ranges with peers, removing what is no longer there.
	SetMeshPeers(n Node, m Mesh, peers []MeshPeer) error
	// MeshStatus reads the device's peers (nil, nil without a device).
	MeshStatus() ([]MeshPeerStatus, error)
	// DelMesh removes the device, its routes and its rules.
	DelMesh(n Node) error
}

// MeshDevice is the mesh link's name on Linux.
const MeshDevice = "k3sm-wg"

// PrivateKey is a WireGuard private key. It prints as "(private key)" in
// every fmt verb and marshals so in JSON and text, so that a Mesh put in
// a log line or an error never shows it.
type PrivateKey [32]byte

const redacted = "(private key)"

func (PrivateKey) Format(f fmt.State, _ rune)   { io.WriteString(f, redacted) }
func (PrivateKey) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Bounds of a Mesh: an MTU an IPv4 link can have and WireGuard can
// carry, and a peer count as wire.MaxMeshPeers (which the server checks
// first).
const (
	meshMinMTU   = 576
	meshMaxMTU   = 9000
	meshMaxPeers = 1024
)

// checkMesh refuses a mesh no implementation could apply.
func checkMesh(m Mesh) error {
	if m.Device != "" && (len(m.Device) > ifNameMax || !isIfName(m.Device) || strings.HasPrefix(m.Device, HostIfPrefix)) {
		return fmt.Errorf("dataplane: mesh device name %q is not a valid interface name outside the pods' prefix", m.Device)
	}
	if m.ListenPort == 0 {
		return fmt.Errorf("dataplane: mesh listen port 0")
	}
	if m.MTU < meshMinMTU || m.MTU > meshMaxMTU {
		return fmt.Errorf("dataplane: mesh MTU %d out of range (%d-%d)", m.MTU, meshMinMTU, meshMaxMTU)
	}
	return nil
}

// CheckMeshPeers refuses peers whose routes would be wrong: a key twice,
// an endpoint that cannot be sent to, a range that is not masked IPv4 or
// that overlaps the node's or another peer's. Every MeshPlane applies it
// (and fakes of one, so they refuse what the real ones do).
func CheckMeshPeers(n Node, peers []MeshPeer) error {
	if len(peers) > meshMaxPeers {
		return fmt.Errorf("dataplane: %d mesh peers, at most %d", len(peers), meshMaxPeers)
	}
	keys := map[[32]byte]bool{}
	for i, p := range peers {
		switch {
		case keys[p.PublicKey]:
			return fmt.Errorf("dataplane: mesh peer %d: its public key is another peer's", i)
		case !p.Endpoint.IsValid() || p.Endpoint.Port() == 0 || p.Endpoint.Addr().IsUnspecified() || p.Endpoint.Addr().IsMulticast() || p.Endpoint.Addr().Zone() != "":
			return fmt.Errorf("dataplane: mesh peer %d: endpoint %v cannot be sent to", i, p.Endpoint)
		case !p.CIDR.IsValid() || !p.CIDR.Addr().Is4() || p.CIDR.Masked() != p.CIDR:
			return fmt.Errorf("dataplane: mesh peer %d: range %v is not a masked IPv4 prefix", i, p.CIDR)
		case p.CIDR.Overlaps(n.CIDR):
			return fmt.Errorf("dataplane: mesh peer %d: range %v overlaps the node's %v", i, p.CIDR, n.CIDR)
		case p.Keepalive < 0 || p.Keepalive > 65535*time.Second:
			return fmt.Errorf("dataplane: mesh peer %d: keepalive %v out of range", i, p.Keepalive)
		}
		keys[p.PublicKey] = true
		for j, q := range peers[:i] {
			if q.CIDR.Overlaps(p.CIDR) {
				return fmt.Errorf("dataplane: mesh peer %d: range %v overlaps peer %d's %v", i, p.CIDR, j, q.CIDR)
			}
		}
	}
	return nil
}
