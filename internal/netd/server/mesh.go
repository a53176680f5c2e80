package server

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

// meshState is the mesh: what the state file records (key name, port,
// peers) and, once the device is up in this process, its key.
type meshState struct {
	keyRef string
	port   uint16
	peers  []wire.ParsedMeshPeer // in the order SetMeshPeers gave them
	// Set while the device is up in this process (never persisted).
	up  bool
	dev string
	key dataplane.PrivateKey
	pub [32]byte
}

func (m *meshState) wirePeers() []wire.MeshPeer {
	var out []wire.MeshPeer
	for _, p := range m.peers {
		out = append(out, wire.MeshPeer{PublicKey: base64.StdEncoding.EncodeToString(p.PublicKey[:]), Endpoint: p.Endpoint.String(), PodCIDR: p.PodCIDR.String()})
	}
	return out
}

func (m *meshState) dpMesh() dataplane.Mesh {
	return dataplane.Mesh{Device: dataplane.MeshDevice, PrivateKey: m.key, ListenPort: m.port, MTU: wire.MeshMTU}
}

func dpPeers(peers []wire.ParsedMeshPeer) []dataplane.MeshPeer {
	out := make([]dataplane.MeshPeer, 0, len(peers))
	for _, p := range peers {
		out = append(out, dataplane.MeshPeer{PublicKey: p.PublicKey, Endpoint: p.Endpoint, CIDR: p.PodCIDR, Keepalive: wire.MeshKeepalive * time.Second})
	}
	return out
}

// meshPlane is the data path's mesh, or the refusal of one that has none.
func (s *Server) meshPlane() (dataplane.MeshPlane, *wire.Response) {
	mp, ok := s.dp.(dataplane.MeshPlane)
	if !ok {
		return nil, failure(wire.CodeUnsupported, "this data path (%s) has no mesh device", runtime.GOOS)
	}
	return mp, nil
}

// configureMesh brings the device up with the key named KeyRef (made now
// if it has no file yet) and the recorded peers, then records the mesh.
func (s *Server) configureMesh(a *wire.ConfigureMeshArgs) *wire.Response {
	mp, refused := s.meshPlane()
	if refused != nil {
		return refused
	}
	if !s.cidr.IsValid() {
		return failure(wire.CodeNotConfigured, "ConfigureMesh before Configure: the node's pod range is what its peers allow from it, and its gateway the mesh device's address")
	}
	if err := wire.CheckConfigureMesh(a); err != nil {
		return failure(wire.CodeInvalid, "%v", err)
	}
	m := &meshState{keyRef: a.KeyRef, port: a.ListenPort}
	if s.mesh != nil {
		m.peers = s.mesh.peers
	}
	var err error
	if err = s.loadMeshKey(m, true); err != nil {
		return failure(wire.CodeInternal, "%v", err)
	}
	if err := s.checkPeers(m, m.peers); err != nil {
		// The node's ranges changed under recorded peers: they go.
		s.log.Warn("dropping the recorded mesh peers", "err", err)
		m.peers = nil
	}
	if err := s.applyMesh(mp, m); err != nil {
		if s.mesh != nil {
			s.mesh.up = false // what the device holds is unknown now
		}
		return failure(wire.CodeInternal, "%v", err)
	}
	s.mesh = m
	if err := s.save(); err != nil {
		return failure(wire.CodeInternal, "the mesh is up but was not recorded: %v", err)
	}
	s.log.Info("mesh up", "device", m.dev, "keyRef", m.keyRef, "publicKey", b64(m.pub), "listenPort", m.port, "peers", len(m.peers))
	return s.meshResponse(mp)
}

// applyMesh makes the device match m: key, port, address, rules, peers.
func (s *Server) applyMesh(mp dataplane.MeshPlane, m *meshState) error {
	n := s.node()
	dev, err := mp.EnsureMesh(n, m.dpMesh())
	if err != nil {
		return fmt.Errorf("mesh device: %w", err)
	}
	m.dev = dev
	if err := mp.SetMeshPeers(n, m.dpMesh(), dpPeers(m.peers)); err != nil {
		return fmt.Errorf("mesh peers: %w", err)
	}
	m.up = true
	return nil
}

// setMeshPeers replaces the peers and records them.
func (s *Server) setMeshPeers(a *wire.SetMeshPeersArgs) *wire.Response {
	mp, refused := s.meshPlane()
	if refused != nil {
		return refused
	}
	if !s.cidr.IsValid() || s.mesh == nil {
		return failure(wire.CodeNotConfigured, "SetMeshPeers before ConfigureMesh: there is no mesh device")
	}
	if !s.mesh.up {
		return failure(wire.CodeNotConfigured, "the mesh device is not up (it failed at netd's start or at the last ConfigureMesh); ConfigureMesh again")
	}
	peers, err := wire.ParseMeshPeers(a)
	if err != nil {
		return failure(wire.CodeInvalid, "%v", err)
	}
	if err := s.checkPeers(s.mesh, peers); err != nil {
		return failure(wire.CodeConflict, "%v", err)
	}
	if err := mp.SetMeshPeers(s.node(), s.mesh.dpMesh(), dpPeers(peers)); err != nil {
		return failure(wire.CodeInternal, "mesh peers: %v", err)
	}
	s.mesh.peers = peers
	if err := s.save(); err != nil {
		return failure(wire.CodeInternal, "%v", err)
	}
	s.log.Info("mesh peers set", "peers", len(peers))
	return s.meshResponse(mp)
}

// checkPeers refuses peers the node's ranges contradict: a range
// overlapping the node's own or its Service range, or outside its
// cluster range; a peer holding the node's own key.
func (s *Server) checkPeers(m *meshState, peers []wire.ParsedMeshPeer) error {
	for i, p := range peers {
		switch {
		case p.PodCIDR.Overlaps(s.cidr):
			return fmt.Errorf("setMeshPeers: peer %d: podCIDR %s overlaps this node's podCIDR %s", i, p.PodCIDR, s.cidr)
		case s.rs.cluster.IsValid() && (!s.rs.cluster.Contains(p.PodCIDR.Addr()) || p.PodCIDR.Bits() < s.rs.cluster.Bits()):
			return fmt.Errorf("setMeshPeers: peer %d: podCIDR %s is outside the clusterCIDR %s", i, p.PodCIDR, s.rs.cluster)
		case s.rs.svc.IsValid() && p.PodCIDR.Overlaps(s.rs.svc):
			return fmt.Errorf("setMeshPeers: peer %d: podCIDR %s overlaps the serviceCIDR %s", i, p.PodCIDR, s.rs.svc)
		case m.pub != [32]byte{} && p.PublicKey == m.pub:
			return fmt.Errorf("setMeshPeers: peer %d: publicKey is this node's own", i)
		}
	}
	return nil
}

func (s *Server) meshStatus() *wire.Response {
	mp, refused := s.meshPlane()
	if refused != nil {
		return refused
	}
	if s.mesh == nil {
		return failure(wire.CodeNotConfigured, "there is no mesh (ConfigureMesh first)")
	}
	return s.meshResponse(mp)
}

// removeMesh takes the device, its routes and rules away and forgets the
// mesh; the key file stays, so the same KeyRef brings the same key back.
func (s *Server) removeMesh() *wire.Response {
	mp, refused := s.meshPlane()
	if refused != nil {
		return refused
	}
	if !s.cidr.IsValid() {
		return &wire.Response{} // no node, so no mesh either
	}
	if err := mp.DelMesh(s.node()); err != nil {
		return failure(wire.CodeInternal, "removing the mesh: %v", err)
	}
	if s.mesh == nil {
		return &wire.Response{}
	}
	s.mesh = nil
	if err := s.save(); err != nil {
		return failure(wire.CodeInternal, "%v", err)
	}
	s.log.Info("mesh removed")
	return &wire.Response{}
}

// meshResponse answers with the mesh as recorded and what the device
// reports of each peer (its endpoint as last seen, handshake, traffic).
func (s *Server) meshResponse(mp dataplane.MeshPlane) *wire.Response {
	m := s.mesh
	res := &wire.MeshResult{ListenPort: m.port, MTU: wire.MeshMTU, Peers: []wire.MeshPeerStatus{}}
	if m.pub != [32]byte{} {
		res.PublicKey = b64(m.pub)
	}
	byKey := map[[32]byte]dataplane.MeshPeerStatus{}
	if m.up {
		res.Device = m.dev
		st, err := mp.MeshStatus()
		if err != nil {
			return failure(wire.CodeInternal, "mesh status: %v", err)
		}
		for _, p := range st {
			byKey[p.PublicKey] = p
		}
	}
	for _, p := range m.peers {
		ps := wire.MeshPeerStatus{PublicKey: b64(p.PublicKey), Endpoint: p.Endpoint.String(), PodCIDR: p.PodCIDR.String()}
		if st, ok := byKey[p.PublicKey]; ok {
			if st.Endpoint.IsValid() {
				ps.Endpoint = st.Endpoint.String()
			}
			if !st.LastHandshake.IsZero() {
				ps.LastHandshake = st.LastHandshake.Unix()
			}
			ps.RxBytes, ps.TxBytes = st.RxBytes, st.TxBytes
		}
		res.Peers = append(res.Peers, ps)
	}
	return &wire.Response{Mesh: res}
}

// resyncMesh brings the recorded mesh up again at start: the device went
// with the previous process. A missing key is not made here (that would
// change the node's identity behind its peers' backs): the mesh stays
// down until the next ConfigureMesh.
func (s *Server) resyncMesh() {
	mp, ok := s.dp.(dataplane.MeshPlane)
	if !ok {
		if s.mesh != nil {
			s.log.Error("a mesh is recorded, but this data path has no mesh device", "keyRef", s.mesh.keyRef)
		}
		return
	}
	if s.mesh == nil {
		// Whatever a netd that died between bringing a mesh up and
		// recording it left: its rules.
		if err := mp.DelMesh(s.node()); err != nil {
			s.log.Error("removing an unrecorded mesh's rules", "err", err)
		}
		return
	}
	m := s.mesh
	if err := s.loadMeshKey(m, false); err != nil {
		s.log.Error("mesh not brought up", "keyRef", m.keyRef, "err", err)
		return
	}
	if err := s.applyMesh(mp, m); err != nil {
		s.log.Error("mesh not brought up", "keyRef", m.keyRef, "err", err)
		return
	}
	s.log.Info("mesh up", "device", m.dev, "keyRef", m.keyRef, "publicKey", b64(m.pub), "listenPort", m.port, "peers", len(m.peers))
}

func b64(k [32]byte) string { return base64.StdEncoding.EncodeToString(k[:]) }

// keyDir is the directory of the mesh keys.
func (s *Server) keyDir() string {
	if s.cfg.KeyDir != "" {
		return filepath.Clean(s.cfg.KeyDir)
	}
	return filepath.Join(filepath.Dir(s.cfg.StateFile), "mesh-keys")
}

// loadMeshKey reads m.keyRef's key into m, making it first when create
// is set and it has no file. Errors name the file, never its content.
func (s *Server) loadMeshKey(m *meshState, create bool) error {
	dir := s.keyDir()
	if err := ensureKeyDir(dir, create); err != nil {
		return err
	}
	path := filepath.Join(dir, m.keyRef+".key")
	key, err := readKeyFile(path)
	if errors.Is(err, fs.ErrNotExist) && create {
		if key, err = makeKeyFile(path); err == nil {
			s.log.Info("made a mesh key", "keyRef", m.keyRef, "file", path)
		}
	}
	if err != nil {
		return err
	}
	pk, err := ecdh.X25519().NewPrivateKey(key[:])
	if err != nil {
		return fmt.Errorf("mesh key %s is not an X25519 private key", path)
	}
	m.key, m.pub = key, [32]byte(pk.PublicKey().Bytes())
	return nil
}

// ensureKeyDir makes dir (0700) when create is set and it is missing, and
// refuses one that is not a directory, that others may enter, or that
// another uid owns: the keys are only as private as their directory.
func ensureKeyDir(dir string, create bool) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) && create {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("mesh key directory: %w", err)
		}
		fi, err = os.Lstat(dir)
	}
	if err != nil {
		return fmt.Errorf("mesh key directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("mesh key directory %s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("mesh key directory %s is %v: only its owner may use it (chmod 700 %s)", dir, fi.Mode().Perm(), dir)
	}
	if uid, ok := fileOwner(fi); ok && uid != os.Geteuid() {
		return fmt.Errorf("mesh key directory %s is owned by uid %d, not k3sm-netd's %d", dir, uid, os.Geteuid())
	}
	return nil
}

// readKeyFile reads a key file: a regular file only its owner, netd, may
// read, holding the key in base64 (as `wg genkey` writes one).
func readKeyFile(path string) (dataplane.PrivateKey, error) {
	var key dataplane.PrivateKey
	fi, err := os.Lstat(path)
	if err != nil {
		return key, err
	}
	if !fi.Mode().IsRegular() {
		return key, fmt.Errorf("mesh key %s is not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return key, fmt.Errorf("mesh key %s is %v: only its owner may read it (chmod 600 %s)", path, fi.Mode().Perm(), path)
	}
	if uid, ok := fileOwner(fi); ok && uid != os.Geteuid() {
		return key, fmt.Errorf("mesh key %s is owned by uid %d, not k3sm-netd's %d", path, uid, os.Geteuid())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return key, fmt.Errorf("mesh key: %w", err)
	}
	defer clear(data)
	// Kept in byte slices, wiped after: no string of the key is made.
	text := bytes.TrimSpace(data)
	var raw [64]byte
	defer clear(raw[:])
	n, err := base64.StdEncoding.Decode(raw[:], text)
	if err != nil || n != len(key) || len(text) != base64.StdEncoding.EncodedLen(len(key)) {
		// Neither the content nor the decoder's message (it quotes an
		// offset into it) is repeated.
		return key, fmt.Errorf("mesh key %s does not hold a key (32 bytes in base64); remove it to have a new one made, which changes the node's public key", path)
	}
	copy(key[:], raw[:n])
	return key, nil
}

// makeKeyFile makes a new private key, clamped as Curve25519 keys are,
// and writes it atomically, 0600.
func makeKeyFile(path string) (dataplane.PrivateKey, error) {
	var key dataplane.PrivateKey
	rand.Read(key[:]) // never fails (crypto/rand)
	key[0] &= 248
	key[31] = key[31]&127 | 64
	text := []byte(base64.StdEncoding.EncodeToString(key[:]) + "\n")
	defer clear(text)
	if err := atomicfile.WriteFile(path, text, 0o600); err != nil {
		return dataplane.PrivateKey{}, fmt.Errorf("mesh key %s: %w", path, err)
	}
	return key, nil
}
