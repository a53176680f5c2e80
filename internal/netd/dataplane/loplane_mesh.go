package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
)

// The darwin mesh: wireguard-go on a utun device netd creates (the kernel
// names it), addressed and routed by rendered ifconfig and route
// commands. No build tag, like the rest of loPlane: the Linux tests drive
// it with a fake device. Pods are lo0 aliases, so traffic between them
// and remote pods is the node's own: it keeps the pod's address (the
// socket's), needs no forwarding, and its MSS comes from the route's MTU;
// pf's nat rule is on the egress interface only, so it never applies.

// wgDevice is wireguard-go's device as loPlane uses it.
type wgDevice interface {
	// Name is the kernel's name of the device's interface.
	Name() string
	SetKey(PrivateKey) error
	IpcSet(uapi string) error
	IpcGet(w io.Writer) error
	Up() error
	Close()
}

// loMesh is the process's mesh device and what was applied to it.
type loMesh struct {
	dev    wgDevice
	key    PrivateKey
	port   uint16
	addr   netip.Addr // the gateway given to the interface (invalid: none yet)
	mtu    int
	peers  map[[32]byte]MeshPeer
	routes []netip.Prefix
}

func (d *loPlane) EnsureMesh(n Node, m Mesh) (string, error) {
	if err := checkNode(n); err != nil {
		return "", err
	}
	if err := checkMesh(m); err != nil {
		return "", err
	}
	d.meshMu.Lock()
	defer d.meshMu.Unlock()
	if d.newWG == nil {
		return "", errors.New("dataplane: no mesh device on this system")
	}
	if d.mesh == nil {
		dev, err := d.newWG(m.MTU)
		if err != nil {
			return "", fmt.Errorf("dataplane: create the mesh device: %w", err)
		}
		if name := dev.Name(); len(name) > ifNameMax || !isIfName(name) {
			dev.Close()
			return "", fmt.Errorf("dataplane: the mesh device's name %q is not an interface name", name)
		}
		d.mesh = &loMesh{dev: dev, peers: map[[32]byte]MeshPeer{}}
	}
	lm := d.mesh
	name := lm.dev.Name()
	if lm.key != m.PrivateKey {
		if err := lm.dev.SetKey(m.PrivateKey); err != nil {
			return "", fmt.Errorf("dataplane: mesh device %s: set its private key failed", name)
		}
		lm.key = m.PrivateKey
	}
	if lm.port != m.ListenPort {
		if err := lm.dev.IpcSet(fmt.Sprintf("listen_port=%d\n", m.ListenPort)); err != nil {
			return "", fmt.Errorf("dataplane: mesh device %s: UDP port %d: %w", name, m.ListenPort, err)
		}
		lm.port = m.ListenPort
	}
	if lm.addr != n.Gateway || lm.mtu != m.MTU {
		if err := d.run(argvMeshUp(name, n.Gateway, m.MTU)); err != nil {
			return "", fmt.Errorf("dataplane: mesh device %s: %w", name, err)
		}
		lm.addr, lm.mtu = n.Gateway, m.MTU
	}
	if err := lm.dev.Up(); err != nil {
		return "", fmt.Errorf("dataplane: mesh device %s up on UDP port %d: %w", name, m.ListenPort, err)
	}
	return name, nil
}

func (d *loPlane) SetMeshPeers(n Node, m Mesh, peers []MeshPeer) error {
	if err := checkNode(n); err != nil {
		return err
	}
	if err := CheckMeshPeers(n, peers); err != nil {
		return err
	}
	d.meshMu.Lock()
	defer d.meshMu.Unlock()
	lm := d.mesh
	if lm == nil {
		return errors.New("dataplane: no mesh device (EnsureMesh first)")
	}
	name := lm.dev.Name()
	uapi, want := meshPeersUAPI(lm.peers, peers)
	if uapi != "" {
		if err := lm.dev.IpcSet(uapi); err != nil {
			lm.peers = nil // unknown: the next call replaces all
			return fmt.Errorf("dataplane: mesh device %s peers: %w", name, err)
		}
	}
	lm.peers = want
	// Routes die with the utun, so what this process added is all there
	// is to keep in step.
	wantRoutes := map[netip.Prefix]bool{}
	for _, p := range peers {
		wantRoutes[p.CIDR] = true
	}
	var keep []netip.Prefix
	for i, r := range lm.routes {
		if wantRoutes[r] {
			keep = append(keep, r)
			continue
		}
		if err := d.run(argvMeshRoute("delete", r, name)); err != nil {
			lm.routes = append(keep, lm.routes[i:]...)
			return fmt.Errorf("dataplane: remove route %v from %s: %w", r, name, err)
		}
	}
	lm.routes = keep
	for _, p := range peers {
		if slices.Contains(lm.routes, p.CIDR) {
			continue
		}
		if err := d.run(argvMeshRoute("add", p.CIDR, name)); err != nil {
			return fmt.Errorf("dataplane: route %v via %s: %w", p.CIDR, name, err)
		}
		lm.routes = append(lm.routes, p.CIDR)
	}
	return nil
}

func (d *loPlane) MeshStatus() ([]MeshPeerStatus, error) {
	d.meshMu.Lock()
	defer d.meshMu.Unlock()
	if d.mesh == nil {
		return nil, nil
	}
	var buf bytes.Buffer
	// The text starts with the private key: parsed and wiped.
	defer func() { b := buf.Bytes(); clear(b[:cap(b)]) }()
	if err := d.mesh.dev.IpcGet(&buf); err != nil {
		return nil, fmt.Errorf("dataplane: mesh device %s status: %w", d.mesh.dev.Name(), err)
	}
	return parseMeshStatus(buf.Bytes())
}

// DelMesh closes the device: the kernel destroys the utun, and its
// address and routes with it.
func (d *loPlane) DelMesh(n Node) error {
	if err := checkNode(n); err != nil {
		return err
	}
	d.meshMu.Lock()
	defer d.meshMu.Unlock()
	if d.mesh != nil {
		d.mesh.dev.Close()
		d.mesh = nil
	}
	return nil
}

var _ MeshPlane = (*loPlane)(nil)
