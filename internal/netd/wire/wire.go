// Package wire owns the protocol between k3sm's unprivileged processes and
// k3sm-netd, the root helper: a closed set of typed, versioned requests in
// length-prefixed JSON frames. It refuses what it does not know (unknown
// fields, verbs, versions, trailing data, oversized frames) and validates
// every field, so nothing a client sends reaches the system unchecked. It
// imports only the standard library.
package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Version is the protocol version; k3sm and k3sm-netd come from the same
// release, so a mismatch is refused rather than negotiated.
const Version = 1

// MaxFrame bounds a request body: the root process never allocates more
// than this for a client.
const MaxFrame = 64 << 10

// MaxResponseFrame bounds a response body, read by the unprivileged client:
// ListPods of a full /16 does not fit in MaxFrame.
const MaxResponseFrame = 16 << 20

// Verb names a request.
type Verb string

const (
	VerbConfigure   Verb = "Configure"
	VerbSetupPod    Verb = "SetupPod"
	VerbTeardownPod Verb = "TeardownPod"
	VerbListPods    Verb = "ListPods"
	VerbSetPolicy   Verb = "SetPolicy"
	VerbSetServices Verb = "SetServices"
)

// Codes of Response.Code: what a client may act on.
const (
	CodeInvalid       = "invalid"        // the request is malformed; retrying does not help
	CodeDenied        = "denied"         // the peer's uid may not use netd
	CodeNotFound      = "not-found"      // the pod has no network netd owns
	CodeConflict      = "conflict"       // the request contradicts the state (CIDR change, exhausted range)
	CodeNotConfigured = "not-configured" // SetupPod before Configure
	CodeInternal      = "internal"       // the system refused; see Error
	CodeUnsupported   = "unsupported"    // this OS's data path cannot do it (NetworkPolicy on darwin)
)

// Request is one call. Exactly one of the argument fields is set, the one
// Verb names (none for ListPods).
type Request struct {
	Version     int              `json:"version"`
	Verb        Verb             `json:"verb"`
	Configure   *ConfigureArgs   `json:"configure,omitempty"`
	SetupPod    *SetupPodArgs    `json:"setupPod,omitempty"`
	TeardownPod *TeardownPodArgs `json:"teardownPod,omitempty"`
	SetPolicy   *SetPolicyArgs   `json:"setPolicy,omitempty"`
	SetServices *SetServicesArgs `json:"setServices,omitempty"`
	// The mesh verbs (mesh.go); MeshStatus and RemoveMesh take none.
	ConfigureMesh *ConfigureMeshArgs `json:"configureMesh,omitempty"`
	SetMeshPeers  *SetMeshPeersArgs  `json:"setMeshPeers,omitempty"`
}

// ConfigureArgs sets up the node's side of the pod network.
type ConfigureArgs struct {
	// PodCIDR is the node's spec.podCIDR: IPv4, /16 to /28.
	PodCIDR string `json:"podCIDR"`
	// ServiceCIDR (optional) becomes local to the node, for the Service
	// proxy and DNS; ClusterCIDR (optional, containing PodCIDR) becomes
	// unreachable beyond the node's own range. IPv4, /8 or longer.
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	ClusterCIDR string `json:"clusterCIDR,omitempty"`
}

// SetupPodArgs gives a pod its address (idempotent per UID).
type SetupPodArgs struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// FromPid (Linux, optional): the pod's network namespace is that
	// process's, made by an unprivileged runtime inside a user namespace
	// of its own (both owned by the caller's uid). netd pins both (at
	// PodResult.NetNS and UserNSPath of it) instead of making one the
	// runtime could not enter; the pod keeps them for its life.
	FromPid int `json:"fromPid,omitempty"`
}

// UserNSPath is where netd pins the user namespace of a pod whose network
// namespace came from its runtime (SetupPodArgs.FromPid), beside that
// namespace's file.
func UserNSPath(netns string) string { return netns + ".user" }

// TeardownPodArgs releases a pod's network.
type TeardownPodArgs struct {
	UID string `json:"uid"`
}

// SetPolicyArgs replaces a pod's NetworkPolicy, resolved to addresses and
// port numbers by the node. netd keeps no copy: the kernel holds it across
// a netd restart, and the node sends every pod's again periodically.
type SetPolicyArgs struct {
	UID     string          `json:"uid"`
	Ingress PolicyDirection `json:"ingress"`
	Egress  PolicyDirection `json:"egress"`
}

// PolicyDirection: not isolated, everything passes (and Rules must be
// empty); isolated, only what a rule allows (none: nothing).
type PolicyDirection struct {
	Isolated bool         `json:"isolated,omitempty"`
	Rules    []PolicyRule `json:"rules,omitempty"`
}

// PolicyRule allows any of Peers (none: any address) on any of Ports
// (none: any protocol and port).
type PolicyRule struct {
	Peers []PolicyPeer `json:"peers,omitempty"`
	Ports []PolicyPort `json:"ports,omitempty"`
}

// PolicyPeer is an IPv4 CIDR less the CIDRs in Except (inside it).
type PolicyPeer struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except,omitempty"`
}

// PolicyPort is "TCP", "UDP" or "SCTP" and a port (0: all) or a range
// Port..EndPort.
type PolicyPort struct {
	Protocol string `json:"protocol"`
	Port     uint16 `json:"port,omitempty"`
	EndPort  uint16 `json:"endPort,omitempty"`
}

// SetServicesArgs is one chunk of the node's full set of ClusterIP
// Service ports. A set of hundreds of Services does not fit in MaxFrame,
// so the node sends it in chunks 0, 1, ... of one Generation, the last
// marked Final; netd keeps the chunks and, at the final one, replaces
// the previous set with the whole new one in one nftables transaction. A
// chunk 0 starts over (dropping an unfinished generation); a chunk out of
// order is refused with CodeConflict, and the node starts again at 0.
type SetServicesArgs struct {
	// Generation names one full set; it only has to differ from the
	// previous one's.
	Generation uint64 `json:"generation"`
	Chunk      int    `json:"chunk"`
	Final      bool   `json:"final,omitempty"`
	// Services of this chunk (none: an empty set, or an empty last chunk).
	Services []ServicePort `json:"services,omitempty"`
}

// ServicePort is one Service address:port of one protocol and the ready
// endpoints it is translated to (none: refused, as kube-proxy does).
type ServicePort struct {
	Protocol string `json:"protocol"` // "TCP" or "UDP"
	IP       string `json:"ip"`
	Port     uint16 `json:"port"`
	// External marks an address from the Service's spec.externalIPs: only
	// such an address may lie outside the node's Service range (netd
	// refuses an unmarked one there, so a bug cannot turn a ClusterIP
	// into an interception of any address).
	External bool `json:"external,omitempty"`
	// NodePort marks IP:Port as a Service's nodePort on an address of the
	// node (Port within NodePortMin..NodePortMax), LoadBalancer as its
	// load-balancer ingress, which on k3sm is an address of the node (any
	// port). Either may lie outside the Service range; netd translates it
	// only while IP is a local address of the host. At most one of
	// External, NodePort and LoadBalancer is set.
	NodePort     bool `json:"nodePort,omitempty"`
	LoadBalancer bool `json:"loadBalancer,omitempty"`
	// Local is externalTrafficPolicy: Local on an External, NodePort or
	// LoadBalancer address: the client's source address is kept (not
	// masqueraded), so every endpoint must be a pod of this node.
	Local     bool       `json:"local,omitempty"`
	Endpoints []Endpoint `json:"endpoints,omitempty"`
}

// Endpoint is one ready backend: a pod address and its target port.
type Endpoint struct {
	IP   string `json:"ip"`
	Port uint16 `json:"port"`
}

// Response answers one Request. Error and Code are set together on failure.
type Response struct {
	Version   int         `json:"version"`
	Error     string      `json:"error,omitempty"`
	Code      string      `json:"code,omitempty"`
	Configure *NodeResult `json:"configure,omitempty"`
	Pod       *PodResult  `json:"pod,omitempty"`
	Pods      []PodResult `json:"pods,omitempty"`
	Mesh      *MeshResult `json:"mesh,omitempty"`
}

// NodeResult is the node's pod network.
type NodeResult struct {
	PodCIDR     string `json:"podCIDR"`
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	ClusterCIDR string `json:"clusterCIDR,omitempty"`
	Gateway     string `json:"gateway"`
	Bridge      string `json:"bridge"`
}

// PodResult is one pod's network.
type PodResult struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	IP        string `json:"ip"`
	PrefixLen int    `json:"prefixLen"`
	Gateway   string `json:"gateway"`
	// NetNS is the pod's network namespace file (Linux; empty elsewhere).
	NetNS string `json:"netns,omitempty"`
	// UserNS is the pod's user namespace file, for a pod set up FromPid:
	// the namespace that owns NetNS, which the runtime enters first.
	UserNS string `json:"userns,omitempty"`
}

// ErrFrameTooLarge is a length header over the limit. The body is not read,
// so the stream cannot continue.
var ErrFrameTooLarge = errors.New("frame too large")

// ErrMalformed is a frame read whole whose body is not a valid message; the
// stream is still in step and may continue.
var ErrMalformed = errors.New("malformed frame")

// WriteRequest validates r and writes it as one frame.
func WriteRequest(w io.Writer, r *Request) error {
	if err := r.Validate(); err != nil {
		return err
	}
	return writeFrame(w, r, MaxFrame)
}

// ReadRequest reads one frame and returns the request only if it decodes
// strictly and validates. Errors wrap ErrFrameTooLarge or ErrMalformed, or
// are the reader's (io.EOF between frames).
func ReadRequest(rd io.Reader) (*Request, error) {
	var r Request
	if err := readFrame(rd, &r, MaxFrame); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return &r, nil
}

// WriteResponse writes r as one frame.
func WriteResponse(w io.Writer, r *Response) error {
	return writeFrame(w, r, MaxResponseFrame)
}

// ReadResponse reads one response frame, refusing another protocol version.
func ReadResponse(rd io.Reader) (*Response, error) {
	var r Response
	if err := readFrame(rd, &r, MaxResponseFrame); err != nil {
		return nil, err
	}
	if r.Version != Version {
		return nil, fmt.Errorf("%w: k3sm-netd speaks protocol version %d, this client %d (run k3sm and k3sm-netd of the same release)", ErrMalformed, r.Version, Version)
	}
	return &r, nil
}

func writeFrame(w io.Writer, v any, limit int) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body) > limit {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooLarge, len(body), limit)
	}
	// One write: the header and the body never interleave with another
	// writer's, and a unix socket gets one message.
	buf := make([]byte, 4, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	_, err = w.Write(append(buf, body...))
	return err
}

func readFrame(rd io.Reader, v any, limit int) error {
	var hdr [4]byte
	if _, err := io.ReadFull(rd, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(limit) {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooLarge, n, limit)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: trailing data after the JSON body", ErrMalformed)
	}
	return nil
}
