// Package dataplane owns every change k3sm-netd makes to the system for the
// pod network: on Linux a network namespace per pod, a veth pair to the
// node's bridge, addresses, routes and the nftables rules (masquerade, the
// forward accepts, each pod's NetworkPolicy and source guard); on darwin the lo0 aliases and the pf anchor, rendered as
// commands netd runs itself. Both also run the node's WireGuard mesh
// device (MeshPlane, mesh.go). Every name and argument is rendered here
// from typed values; nothing a client sent is ever used as text.
package dataplane

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/netip"
)

// Node is the node side of the pod network: one bridge whose address (the
// first of the CIDR) is every pod's gateway.
type Node struct {
	// CIDR is the node's pod range (Node.spec.podCIDR), e.g. 100.64.0.0/24.
	CIDR netip.Prefix
	// Gateway is CIDR's first address, on the bridge (Linux) or lo0 (darwin).
	Gateway netip.Addr
	// Bridge is the host interface name ("k3sm0").
	Bridge string
	// ServiceCIDR, when set, is made local to the node (Linux: a local
	// route on lo) so the Service proxy and DNS answer on every ClusterIP
	// and pods reach them through their default route; nothing addressed
	// to a Service ever leaves the node.
	ServiceCIDR netip.Prefix
	// ClusterCIDR, when set, is unreachable except for the ranges routed
	// more specifically (this node's CIDR; later the mesh's peers), so a
	// pod address that is nobody's is refused here instead of leaving by
	// the default route.
	ClusterCIDR netip.Prefix
}

// Pod is one pod's network.
type Pod struct {
	// UID is the pod's UID (validated by the caller: [0-9a-f-], ≤ 64).
	UID string
	// IP is the pod's address inside Node.CIDR.
	IP netip.Addr
	// NetNS is the path netd bind-mounts the pod's network namespace on
	// (Linux), under the directory netd owns; empty on darwin.
	NetNS string
	// HostIf is the host end of the pod's veth (Linux), derived from UID by
	// HostIfName; empty on darwin.
	HostIf string
	// UserNS (Linux) is set for a pod whose namespaces are its runtime's:
	// the file its user namespace is pinned on (wire.UserNSPath of NetNS).
	// AddPod never makes such a pod's network namespace: it pins the ones
	// of process FromPid, which must belong to uid Owner, or fails when
	// they are gone and FromPid is 0.
	UserNS  string
	FromPid int
	Owner   int
}

// Inventory is what exists on the system and is ours, for resync after a
// restart and for refusing what is not ours.
type Inventory struct {
	// NetNS are the pod namespace files under the netns directory.
	NetNS []string
	// HostIfs are host links named with the k3sm pod prefix.
	HostIfs []string
	// NodeReady reports that the bridge and the rules of Node exist.
	NodeReady bool
	// Addrs (darwin) are the pod addresses aliased on lo0 inside
	// Node.CIDR, the gateway excluded: darwin has no namespace or link per
	// pod, so the alias is what marks a pod as present.
	Addrs []netip.Addr
}

// Options configures New. Every field is portable so that netd builds the
// same struct on every OS; each OS reads only its own fields.
type Options struct {
	// HostNSPath (Linux) is a network namespace file treated as "the host":
	// the bridge, the host ends of the veths, forwarding and the rules go
	// there. Empty means the namespace of the calling process. Tests pass a
	// namespace of their own so that nothing touches the real host.
	HostNSPath string
	// NetNSDir (Linux) is the directory netd owns for the pods' namespace
	// files. Every Pod.NetNS must sit directly in it, so that DelPod never
	// unmounts or removes anything else; Inventory lists it.
	NetNSDir string
	// MTU (Linux) of the bridge and of both ends of every veth; 0 = 1500.
	MTU int
	// Logger gets the mesh device's errors (wireguard-go's: a failed
	// handshake or send); nil discards them.
	Logger *slog.Logger

	// Runner (darwin) runs one rendered command (argv, never a shell);
	// nil runs it with os/exec.
	Runner func(argv []string) error
	// Output (darwin) runs a rendered command and returns its standard
	// output, for what must be read back (ifconfig lo0, route get, the pf
	// enable token); nil runs it with os/exec.
	Output func(argv []string) ([]byte, error)
	// PFDir (darwin) is the directory, owned by netd, the pf anchor file is
	// written into before pfctl loads it.
	PFDir string
	// Egress (darwin) is the interface the pods' outbound traffic is
	// translated on; empty means the default route's interface, looked up
	// at EnsureNode.
	Egress string
}

// Dataplane applies the pod network to the system. Every method is
// idempotent: it creates what is missing, keeps what exists and matches,
// and replaces what exists and differs. Implementations: Linux (netlink,
// netns, google/nftables), darwin (rendered ifconfig/pfctl commands), and a
// fallback that refuses with a clear error.
type Dataplane interface {
	// EnsureNode sets up the bridge (or lo0 gateway alias), IPv4
	// forwarding, and the NAT and forward rules for n.CIDR.
	EnsureNode(n Node) error
	// AddPod creates the pod's namespace at p.NetNS (if missing), its veth
	// pair (host end p.HostIf on n.Bridge, peer "eth0" inside with
	// p.IP/len(n.CIDR), up), lo up, and the default route via n.Gateway.
	// A namespace whose pin is missing but that still holds the pod's
	// veth and a process (the pin went with another mount namespace) is
	// pinned again, not replaced.
	AddPod(n Node, p Pod) error
	// DelPod removes the pod's veth and namespace (unmount + remove the
	// file) and its policy and source guard. Missing parts are not an error.
	DelPod(p Pod) error
	// SetPolicy replaces the pod's NetworkPolicy in one atomic change, and
	// guards its port so that it sends only from its own address (policy
	// peers are matched by address). Established connections are never
	// cut by a change. ErrPolicyUnsupported where it cannot be enforced.
	SetPolicy(n Node, p Pod, pol Policy) error
	// SetServices replaces the node's whole set of ClusterIP Service
	// ports with svcs in one atomic change: new connections to a Service
	// port are translated to one of its endpoints at random (refused at
	// once when it has none); established ones keep theirs (conntrack).
	// ErrServicesUnsupported where the kernel cannot do it.
	SetServices(n Node, svcs []Service) error
	// Inventory lists what is ours on the system.
	Inventory(n Node) (Inventory, error)
	// DelNode removes the bridge and the rules (k3sm uninstall, tests).
	DelNode(n Node) error
}

// HostIfPrefix starts the name of every pod's host-side veth.
const HostIfPrefix = "k3v"

// HostIfName is the host end of a pod's veth: the prefix and the first 10
// hex digits of the UID's SHA-256 (13 bytes, under IFNAMSIZ's 15).
func HostIfName(uid string) string {
	sum := sha256.Sum256([]byte(uid))
	return HostIfPrefix + hex.EncodeToString(sum[:5])
}

// ErrPolicyUnsupported is SetPolicy of an isolating policy on a data path
// that cannot enforce one (darwin's pods share lo0).
var ErrPolicyUnsupported = errors.New("dataplane: NetworkPolicy is not enforced on this OS")

// Policy is what a pod may send and receive, as the NetworkPolicies that
// select it say once resolved to addresses and port numbers. Traffic
// between the pod and the node itself is always allowed (the kubelet's
// probes, the Service proxy, DNS), as upstream network plugins do.
type Policy struct {
	Ingress, Egress Direction
}

// Direction is one side of a Policy. Not isolated: everything passes and
// Rules are ignored. Isolated: only what some Rule allows passes (none:
// nothing), plus replies of connections it allowed.
type Direction struct {
	Isolated bool
	Rules    []Rule
}

// Rule allows traffic from (ingress) or to (egress) any of Peers on any of
// Ports. No Peers: any address; no Ports: any protocol and port.
type Rule struct {
	Peers []Peer
	Ports []Port
}

// Peer is an IPv4 range less its exceptions (pods are /32s).
type Peer struct {
	CIDR   netip.Prefix
	Except []netip.Prefix
}

// Protocol is an IP protocol number a Port names.
type Protocol uint8

// The protocols NetworkPolicy ports name.
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

// Port is a destination port or range of one protocol. Port 0: every port
// of the protocol; EndPort 0: Port alone.
type Port struct {
	Protocol      Protocol
	Port, EndPort uint16
}

// ErrServicesUnsupported is SetServices on a data path without in-kernel
// Service translation (darwin: the node's userspace proxy serves them).
var ErrServicesUnsupported = errors.New("dataplane: in-kernel Service translation is not available on this OS (use the userspace proxy)")

// Service is one Service port of TCP or UDP, on a ClusterIP or (External)
// an address of spec.externalIPs, and its ready endpoints (none:
// connections are refused, as kube-proxy does).
type Service struct {
	Protocol Protocol
	IP       netip.Addr
	Port     uint16
	// External: IP is an externalIP, which may lie outside the Service
	// range; traffic to it is routed, not local, so without endpoints it
	// is refused in the forward path too.
	External bool
	// OnNode: IP is an address of the node (a nodePort, or the
	// load-balancer ingress), which may lie outside the Service range; it
	// is translated only while it is a local address of the host.
	OnNode bool
	// Local (externalTrafficPolicy: Local, with External or OnNode): the
	// client's address is kept, not masqueraded, so the endpoints must be
	// pods of this node (inside Node.CIDR).
	Local     bool
	Endpoints []netip.AddrPort
}
