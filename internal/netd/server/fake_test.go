package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
)

// fakeDP is the system in memory, refusing what the real data path would:
// pods before their node, addresses outside the node's range or taken by
// another pod, host names not derived from the UID. It makes and removes
// the namespace files for real, as the Linux one bind-mounts them.
type fakeDP struct {
	mu       sync.Mutex
	netnsDir string
	node     *dataplane.Node
	links    map[string]dataplane.Pod    // by host interface
	policies map[string]dataplane.Policy // by host interface
	failPol  error
	failAdd  map[string]error // by UID
	calls    []string
	// When set (before the server starts), DelPod of a pod reports its UID
	// on delEntered, then waits for delRelease to close.
	delEntered chan string
	delRelease chan struct{}

	// The mesh device: nil when there is none (never made, removed, or
	// gone with a restart: a new fakeDP).
	mesh      *dataplane.Mesh
	meshPeers []dataplane.MeshPeer
	// handshake is what MeshStatus reports of every peer.
	handshake time.Time
	failMesh  error
}

func newFakeDP(netnsDir string) *fakeDP {
	return &fakeDP{netnsDir: netnsDir, links: map[string]dataplane.Pod{}, policies: map[string]dataplane.Policy{}, failAdd: map[string]error{}}
}

func (f *fakeDP) factory() (dataplane.Dataplane, error) { return f, nil }

func (f *fakeDP) record(format string, a ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, a...))
}

// count reports how many calls start with prefix.
func (f *fakeDP) count(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

func (f *fakeDP) EnsureNode(n dataplane.Node) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("EnsureNode %s", n.CIDR)
	if !n.CIDR.IsValid() || n.Gateway != n.CIDR.Addr().Next() || n.Bridge == "" {
		return fmt.Errorf("bad node %+v", n)
	}
	f.node = &n
	return nil
}

func (f *fakeDP) AddPod(n dataplane.Node, p dataplane.Pod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("AddPod %s %s", p.UID, p.IP)
	switch {
	case f.node == nil || *f.node != n:
		return errors.New("AddPod before EnsureNode of its node")
	case !n.CIDR.Contains(p.IP) || p.IP == n.CIDR.Addr() || p.IP == n.Gateway || p.IP == dataplane.Broadcast(n.CIDR):
		return fmt.Errorf("address %s is not a pod address of %s", p.IP, n.CIDR)
	case p.HostIf != dataplane.HostIfName(p.UID):
		return fmt.Errorf("host interface %q is not %s's", p.HostIf, p.UID)
	case filepath.Dir(p.NetNS) != f.netnsDir:
		return fmt.Errorf("netns %q is not under %s", p.NetNS, f.netnsDir)
	}
	if err := f.failAdd[p.UID]; err != nil {
		return err
	}
	for h, q := range f.links {
		if q.IP == p.IP && h != p.HostIf {
			return fmt.Errorf("%s is already %s's", p.IP, q.UID)
		}
	}
	if err := os.MkdirAll(f.netnsDir, 0o700); err != nil {
		return err
	}
	if _, err := os.Stat(p.NetNS); err != nil {
		if err := os.WriteFile(p.NetNS, nil, 0o600); err != nil {
			return err
		}
	}
	f.links[p.HostIf] = p
	return nil
}

func (f *fakeDP) DelPod(p dataplane.Pod) error {
	if f.delEntered != nil && p.UID != "" {
		f.delEntered <- p.UID
		<-f.delRelease
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("DelPod %s %s %s", p.UID, p.HostIf, p.NetNS)
	if p.HostIf != "" {
		delete(f.links, p.HostIf)
		delete(f.policies, p.HostIf)
	}
	if p.NetNS != "" {
		if err := os.Remove(p.NetNS); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

func (f *fakeDP) SetPolicy(n dataplane.Node, p dataplane.Pod, pol dataplane.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("SetPolicy %s", p.UID)
	switch {
	case f.node == nil || *f.node != n:
		return errors.New("SetPolicy before EnsureNode of its node")
	case f.links[p.HostIf] != p:
		return fmt.Errorf("SetPolicy of %s, which has no pod network", p.UID)
	case f.failPol != nil:
		return f.failPol
	}
	f.policies[p.HostIf] = pol
	return nil
}

func (f *fakeDP) SetServices(n dataplane.Node, svcs []dataplane.Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("SetServices %d", len(svcs))
	if f.node == nil || *f.node != n {
		return errors.New("SetServices before EnsureNode of its node")
	}
	return nil
}

func (f *fakeDP) policy(uid string) (dataplane.Policy, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.policies[dataplane.HostIfName(uid)]
	return p, ok
}

func (f *fakeDP) Inventory(n dataplane.Node) (dataplane.Inventory, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	inv := dataplane.Inventory{NodeReady: f.node != nil && *f.node == n}
	for h := range f.links {
		inv.HostIfs = append(inv.HostIfs, h)
	}
	entries, _ := os.ReadDir(f.netnsDir)
	for _, e := range entries {
		inv.NetNS = append(inv.NetNS, filepath.Join(f.netnsDir, e.Name()))
	}
	slices.Sort(inv.HostIfs)
	return inv, nil
}

func (f *fakeDP) DelNode(n dataplane.Node) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("DelNode %s", n.CIDR)
	f.node = nil
	return nil
}

func (f *fakeDP) link(uid string) (dataplane.Pod, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.links[dataplane.HostIfName(uid)]
	return p, ok
}

func (f *fakeDP) linkCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.links)
}

func (f *fakeDP) EnsureMesh(n dataplane.Node, m dataplane.Mesh) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("EnsureMesh %d", m.ListenPort)
	switch {
	case f.node == nil || *f.node != n:
		return "", errors.New("EnsureMesh before EnsureNode of its node")
	case m.PrivateKey == dataplane.PrivateKey{}:
		return "", errors.New("EnsureMesh without a private key")
	case m.Device != dataplane.MeshDevice || m.MTU != 1380 || m.ListenPort == 0:
		return "", fmt.Errorf("bad mesh %+v", m)
	case f.failMesh != nil:
		return "", f.failMesh
	}
	if f.mesh == nil {
		f.meshPeers = nil // a new device has no peers
	}
	f.mesh = &m
	return m.Device, nil
}

func (f *fakeDP) SetMeshPeers(n dataplane.Node, m dataplane.Mesh, peers []dataplane.MeshPeer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("SetMeshPeers %d", len(peers))
	switch {
	case f.node == nil || *f.node != n:
		return errors.New("SetMeshPeers before EnsureNode of its node")
	case f.mesh == nil || *f.mesh != m:
		return errors.New("SetMeshPeers of another mesh than the device's")
	}
	if err := dataplane.CheckMeshPeers(n, peers); err != nil {
		return err
	}
	for _, p := range peers {
		if p.Keepalive != 25*time.Second {
			return fmt.Errorf("peer %+v: keepalive is not the mesh's", p)
		}
	}
	f.meshPeers = slices.Clone(peers)
	return nil
}

func (f *fakeDP) MeshStatus() ([]dataplane.MeshPeerStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mesh == nil {
		return nil, nil
	}
	var out []dataplane.MeshPeerStatus
	for _, p := range f.meshPeers {
		out = append(out, dataplane.MeshPeerStatus{PublicKey: p.PublicKey, Endpoint: p.Endpoint, LastHandshake: f.handshake, RxBytes: 7, TxBytes: 9})
	}
	return out, nil
}

func (f *fakeDP) DelMesh(n dataplane.Node) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("DelMesh %s", n.CIDR)
	f.mesh, f.meshPeers = nil, nil
	return nil
}

// meshState is the device's key and peers (ok false: no device).
func (f *fakeDP) meshState() (m dataplane.Mesh, peers []dataplane.MeshPeer, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mesh == nil {
		return m, nil, false
	}
	return *f.mesh, slices.Clone(f.meshPeers), true
}

var (
	_ dataplane.Dataplane = (*fakeDP)(nil)
	_ dataplane.MeshPlane = (*fakeDP)(nil)
)
