package dataplane

import (
	"net/netip"
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
	PrivateKey [32]byte
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
