package wire

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
