// Package client calls k3sm-netd for the runtime daemon and the node's
// Service proxy: one typed method
// per verb, a connection per call, errors carrying the server's code. It
// imports only the standard library and the wire protocol.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

// Client talks to the netd on one socket. It is safe for concurrent use.
type Client struct {
	socket string

	svcMu sync.Mutex // one SetServices at a time: chunks of two would interleave
	gen   uint64     // the last SetServices generation sent
}

// New returns a client of the netd serving on socket.
func New(socket string) *Client { return &Client{socket: socket} }

// Error is a refusal by netd (or of a request the client would not send).
type Error struct {
	Code    string // a wire.Code* value
	Message string
}

func (e *Error) Error() string { return "k3sm-netd: " + e.Message + " (" + e.Code + ")" }

// IsNotFound reports whether err is netd saying it owns no network for the pod.
func IsNotFound(err error) bool { return hasCode(err, wire.CodeNotFound) }

// IsNotConfigured reports whether err is SetupPod (or ConfigureMesh)
// before Configure, or a mesh verb before ConfigureMesh.
func IsNotConfigured(err error) bool { return hasCode(err, wire.CodeNotConfigured) }

func hasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// defaultTimeout bounds a call whose context has no deadline: netd answers
// in milliseconds, and a stuck root helper must not hang a pod start.
const defaultTimeout = 30 * time.Second

// Configure sets up the node's pod network for podCIDR (idempotent).
func (c *Client) Configure(ctx context.Context, podCIDR string) (wire.NodeResult, error) {
	return c.ConfigureRanges(ctx, wire.ConfigureArgs{PodCIDR: podCIDR})
}

// ConfigureRanges is Configure with the node's Service and cluster ranges.
func (c *Client) ConfigureRanges(ctx context.Context, a wire.ConfigureArgs) (wire.NodeResult, error) {
	resp, err := c.do(ctx, &wire.Request{Verb: wire.VerbConfigure, Configure: &a})
	if err != nil {
		return wire.NodeResult{}, err
	}
	if resp.Configure == nil {
		return wire.NodeResult{}, errors.New("k3sm-netd: Configure answered without a result")
	}
	return *resp.Configure, nil
}

// SetupPod gives the pod its address and namespace; again for the same UID
// returns the same address.
func (c *Client) SetupPod(ctx context.Context, uid, namespace, name string) (wire.PodResult, error) {
	return c.SetupPodFrom(ctx, uid, namespace, name, 0)
}

// SetupPodFrom is SetupPod for a runtime that is not root: the pod's
// network namespace is process pid's, in a user namespace of the
// runtime's (wire.SetupPodArgs.FromPid); 0 is SetupPod.
func (c *Client) SetupPodFrom(ctx context.Context, uid, namespace, name string, pid int) (wire.PodResult, error) {
	resp, err := c.do(ctx, &wire.Request{Verb: wire.VerbSetupPod, SetupPod: &wire.SetupPodArgs{UID: uid, Namespace: namespace, Name: name, FromPid: pid}})
	if err != nil {
		return wire.PodResult{}, err
	}
	if resp.Pod == nil {
		return wire.PodResult{}, errors.New("k3sm-netd: SetupPod answered without a result")
	}
	return *resp.Pod, nil
}

// TeardownPod releases the pod's network; IsNotFound(err) when netd has
// none for it.
func (c *Client) TeardownPod(ctx context.Context, uid string) error {
	_, err := c.do(ctx, &wire.Request{Verb: wire.VerbTeardownPod, TeardownPod: &wire.TeardownPodArgs{UID: uid}})
	return err
}

// SetPolicy replaces the pod's NetworkPolicy; IsNotFound(err) when netd
// has no network for it, an *Error with wire.CodeUnsupported where it
// cannot be enforced.
func (c *Client) SetPolicy(ctx context.Context, a wire.SetPolicyArgs) error {
	_, err := c.do(ctx, &wire.Request{Verb: wire.VerbSetPolicy, SetPolicy: &a})
	return err
}

// SetServices replaces the node's ClusterIP Service ports with svcs, in
// as many chunks as the frame limit needs; netd applies them all at once
// after the last. The chunks go one connection each, so a set of hundreds
// of Services costs a few round trips, not one per Service.
func (c *Client) SetServices(ctx context.Context, svcs []wire.ServicePort) error {
	c.svcMu.Lock()
	defer c.svcMu.Unlock()
	if c.gen == 0 {
		// A restarted node must not continue a generation it never began.
		c.gen = uint64(time.Now().UnixNano())
	}
	c.gen++
	chunks, err := chunkServices(svcs)
	if err != nil {
		return err
	}
	for i, ch := range chunks {
		a := wire.SetServicesArgs{Generation: c.gen, Chunk: i, Final: i == len(chunks)-1, Services: ch}
		if _, err := c.do(ctx, &wire.Request{Verb: wire.VerbSetServices, SetServices: &a}); err != nil {
			return err
		}
	}
	return nil
}

// chunkBudget is what a chunk's Services may take of MaxFrame, leaving
// room for the request around them.
const chunkBudget = wire.MaxFrame - 512

// chunkServices splits svcs into chunks whose frames fit in MaxFrame (one
// chunk, possibly empty, at the least).
func chunkServices(svcs []wire.ServicePort) ([][]wire.ServicePort, error) {
	var out [][]wire.ServicePort
	var cur []wire.ServicePort
	size := 0
	for _, s := range svcs {
		b, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		n := len(b) + 1 // and a comma
		if n > chunkBudget {
			return nil, &Error{Code: wire.CodeInvalid, Message: fmt.Sprintf("Service %s %s:%d: %d bytes with its endpoints, more than one frame holds (at most %d endpoints)", s.Protocol, s.IP, s.Port, n, wire.MaxServiceEndpoints)}
		}
		if size+n > chunkBudget {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, s)
		size += n
	}
	out = append(out, cur)
	if len(out) > wire.MaxServiceChunks {
		return nil, &Error{Code: wire.CodeInvalid, Message: fmt.Sprintf("%d Service ports need %d chunks, at most %d", len(svcs), len(out), wire.MaxServiceChunks)}
	}
	return out, nil
}

// ListPods returns every pod netd has given an address.
func (c *Client) ListPods(ctx context.Context) ([]wire.PodResult, error) {
	resp, err := c.do(ctx, &wire.Request{Verb: wire.VerbListPods})
	if err != nil {
		return nil, err
	}
	return resp.Pods, nil
}

// ConfigureMesh brings up the node's mesh device with the key netd keeps
// under a.KeyRef (made at the first call that names it) and returns the
// device with its public key. It needs Configure first
// (IsNotConfigured otherwise); an *Error with wire.CodeUnsupported where
// the data path has no mesh.
func (c *Client) ConfigureMesh(ctx context.Context, a wire.ConfigureMeshArgs) (wire.MeshResult, error) {
	return c.mesh(ctx, &wire.Request{Verb: wire.VerbConfigureMesh, ConfigureMesh: &a})
}

// SetMeshPeers replaces the mesh's peers with peers (none: no peers) and
// returns the device's state. It needs ConfigureMesh first
// (IsNotConfigured otherwise).
func (c *Client) SetMeshPeers(ctx context.Context, peers []wire.MeshPeer) (wire.MeshResult, error) {
	a := wire.SetMeshPeersArgs{Peers: peers}
	if len(peers) == 0 {
		a.Peers = nil // an empty list is sent as none
	}
	return c.mesh(ctx, &wire.Request{Verb: wire.VerbSetMeshPeers, SetMeshPeers: &a})
}

// MeshStatus returns the mesh device and what it knows of each peer
// (IsNotConfigured when there is no mesh).
func (c *Client) MeshStatus(ctx context.Context) (wire.MeshResult, error) {
	return c.mesh(ctx, &wire.Request{Verb: wire.VerbMeshStatus})
}

// RemoveMesh takes the mesh device down for good (idempotent); netd keeps
// the key file, so a later ConfigureMesh with the same KeyRef brings the
// same public key back.
func (c *Client) RemoveMesh(ctx context.Context) error {
	_, err := c.do(ctx, &wire.Request{Verb: wire.VerbRemoveMesh})
	return err
}

func (c *Client) mesh(ctx context.Context, req *wire.Request) (wire.MeshResult, error) {
	resp, err := c.do(ctx, req)
	if err != nil {
		return wire.MeshResult{}, err
	}
	if resp.Mesh == nil {
		return wire.MeshResult{}, fmt.Errorf("k3sm-netd: %s answered without a result", req.Verb)
	}
	return *resp.Mesh, nil
}

func (c *Client) do(ctx context.Context, req *wire.Request) (*wire.Response, error) {
	req.Version = wire.Version
	if err := req.Validate(); err != nil {
		return nil, &Error{Code: wire.CodeInvalid, Message: err.Error()}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultTimeout)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return nil, fmt.Errorf("k3sm-netd: %w", err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	// Cancellation before the deadline ends the call at once.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	werr := wire.WriteRequest(conn, req)
	if errors.Is(werr, wire.ErrFrameTooLarge) {
		// Nothing was sent, so no answer comes: say so now.
		return nil, &Error{Code: wire.CodeInvalid, Message: werr.Error()}
	}
	// netd may refuse before reading (a denied uid): its answer is read
	// even when the write failed.
	resp, err := wire.ReadResponse(conn)
	if err != nil {
		if werr != nil {
			err = werr
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Only the context sets the connection's deadline; its own
			// timer may not have fired yet.
			<-ctx.Done()
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("k3sm-netd %s: %w", req.Verb, err)
	}
	if resp.Code != "" || resp.Error != "" {
		return nil, &Error{Code: resp.Code, Message: resp.Error}
	}
	return resp, nil
}
