// Package v1 is the MeshPeer API (net.k3sm.io/v1): one cluster-scoped
// object per node, named after it, that tells the other nodes how to reach
// its pods through the WireGuard mesh: its public key, the UDP endpoint it
// listens on and its pod range. The node writes its own (spec, and in
// status what its device knows of the others); every node reads them all.
// Only public keys are ever here: private keys stay in k3sm-netd.
//
// The types are hand-written (with their DeepCopy methods): clients use
// the dynamic client and the converters in convert.go. The CRD the server
// installs is CRD; Validate is the check a node applies to every peer
// before it hands it to its device, and the CRD's schema refuses the same
// objects.
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The API's names.
const (
	GroupName = "net.k3sm.io"
	Version   = "v1"
	Kind      = "MeshPeer"
	ListKind  = "MeshPeerList"
	Resource  = "meshpeers"
	// CRDName is the CustomResourceDefinition's name.
	CRDName = Resource + "." + GroupName
)

// DefaultPersistentKeepalive is a peer's persistent keepalive in seconds:
// it keeps NAT and firewall state open between nodes behind one.
const DefaultPersistentKeepalive = 25

var (
	// SchemeGroupVersion is net.k3sm.io/v1.
	SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}
	// MeshPeerGVR is the meshpeers resource, for the dynamic client.
	MeshPeerGVR = SchemeGroupVersion.WithResource(Resource)
	// MeshPeerGVK is the MeshPeer kind.
	MeshPeerGVK = SchemeGroupVersion.WithKind(Kind)

	// SchemeBuilder registers MeshPeer and MeshPeerList.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &MeshPeer{}, &MeshPeerList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

// MeshPeer is one node's place in the mesh. Its name is the node's name,
// and its owner the Node, so the garbage collector deletes it with the
// Node.
type MeshPeer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MeshPeerSpec   `json:"spec"`
	Status MeshPeerStatus `json:"status,omitempty"`
}

// MeshPeerSpec is how the other nodes reach this node's pods.
type MeshPeerSpec struct {
	// NodeName is the node's name (== metadata.name).
	NodeName string `json:"nodeName"`
	// PublicKey is the node's WireGuard public key: standard base64 of 32
	// bytes (44 characters).
	PublicKey string `json:"publicKey"`
	// Endpoint is where the node's device listens: IPv4:port or
	// [IPv6]:port.
	Endpoint string `json:"endpoint"`
	// PodCIDR is the node's pod range (its Node's spec.podCIDR).
	PodCIDR string `json:"podCIDR"`
	// AllowedIPs are the addresses the peers accept from this node through
	// the mesh: [PodCIDR].
	AllowedIPs []string `json:"allowedIPs"`
	// MeshIP is the node's address on the mesh: its pods' gateway, the
	// first host address of PodCIDR.
	MeshIP string `json:"meshIP"`
	// PersistentKeepalive in seconds (DefaultPersistentKeepalive; 0: off).
	PersistentKeepalive int32 `json:"persistentKeepalive,omitempty"`
}

// MeshPeerStatus is what the node's device knows of the other nodes.
type MeshPeerStatus struct {
	// LastHandshakeTime is the newest handshake with any peer.
	LastHandshakeTime *metav1.Time `json:"lastHandshakeTime,omitempty"`
	// Reachable: every peer is (true with no peers).
	Reachable bool `json:"reachable"`
	// Peers, one per other node the device has, by node name.
	Peers []PeerStatus `json:"peers,omitempty"`
}

// PeerStatus is what the node's device knows of one other node.
type PeerStatus struct {
	NodeName string `json:"nodeName"`
	// LastHandshakeTime is the last completed handshake (none: never).
	LastHandshakeTime *metav1.Time `json:"lastHandshakeTime,omitempty"`
	// Reachable: a handshake completed within ReachableWithin.
	Reachable bool `json:"reachable"`
}

// MeshPeerList is a list of MeshPeers.
type MeshPeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []MeshPeer `json:"items"`
}
