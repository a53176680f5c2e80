package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"os"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

// meshDP is nopDP with a mesh that keeps its peers.
type meshDP struct {
	nopDP
	peers *[]dataplane.MeshPeer
}

func (meshDP) EnsureMesh(_ dataplane.Node, m dataplane.Mesh) (string, error) { return m.Device, nil }
func (d meshDP) SetMeshPeers(_ dataplane.Node, _ dataplane.Mesh, peers []dataplane.MeshPeer) error {
	*d.peers = peers
	return nil
}
func (d meshDP) MeshStatus() ([]dataplane.MeshPeerStatus, error) {
	var out []dataplane.MeshPeerStatus
	for _, p := range *d.peers {
		out = append(out, dataplane.MeshPeerStatus{PublicKey: p.PublicKey, Endpoint: p.Endpoint, RxBytes: 1})
	}
	return out, nil
}
func (meshDP) DelMesh(dataplane.Node) error { return nil }

func TestClientMesh(t *testing.T) {
	c := New(startServerWith(t, os.Getuid(), meshDP{peers: new([]dataplane.MeshPeer)}))
	ctx := context.Background()
	if _, err := c.ConfigureMesh(ctx, wire.ConfigureMeshArgs{KeyRef: "node", ListenPort: 51820}); !IsNotConfigured(err) {
		t.Fatalf("ConfigureMesh before Configure: %v", err)
	}
	if _, err := c.ConfigureRanges(ctx, wire.ConfigureArgs{PodCIDR: "100.64.0.0/24", ClusterCIDR: "100.64.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	m, err := c.ConfigureMesh(ctx, wire.ConfigureMeshArgs{KeyRef: "node", ListenPort: 51820})
	if err != nil || m.Device != dataplane.MeshDevice || m.ListenPort != 51820 || m.MTU != wire.MeshMTU || m.PublicKey == "" {
		t.Fatalf("ConfigureMesh = %+v %v", m, err)
	}
	peer := wire.MeshPeer{PublicKey: base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)), Endpoint: "192.0.2.1:51820", PodCIDR: "100.64.1.0/24"}
	m, err = c.SetMeshPeers(ctx, []wire.MeshPeer{peer})
	if err != nil || len(m.Peers) != 1 || m.Peers[0].PodCIDR != peer.PodCIDR || m.Peers[0].RxBytes != 1 {
		t.Fatalf("SetMeshPeers = %+v %v", m, err)
	}
	if st, err := c.MeshStatus(ctx); err != nil || len(st.Peers) != 1 || st.PublicKey != m.PublicKey {
		t.Fatalf("MeshStatus = %+v %v", st, err)
	}
	// An empty list is sent as none.
	if m, err = c.SetMeshPeers(ctx, []wire.MeshPeer{}); err != nil || len(m.Peers) != 0 {
		t.Fatalf("SetMeshPeers(none) = %+v %v", m, err)
	}
	var e *Error
	if _, err := c.SetMeshPeers(ctx, []wire.MeshPeer{{PublicKey: "x"}}); !errors.As(err, &e) || e.Code != wire.CodeInvalid {
		t.Fatalf("a bad peer: %v", err)
	}
	if err := c.RemoveMesh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.MeshStatus(ctx); !IsNotConfigured(err) {
		t.Fatalf("MeshStatus after RemoveMesh: %v", err)
	}

	plain := New(startServer(t, os.Getuid()))
	if _, err := plain.Configure(ctx, "100.64.0.0/24"); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.ConfigureMesh(ctx, wire.ConfigureMeshArgs{KeyRef: "node", ListenPort: 51820}); !errors.As(err, &e) || e.Code != wire.CodeUnsupported {
		t.Fatalf("ConfigureMesh on a data path without a mesh: %v", err)
	}
}
