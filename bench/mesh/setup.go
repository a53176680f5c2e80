//go:build linux

package main

import (
	"crypto/ecdh"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/bench/internal/isolated"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
)

// The addresses of both setups. Each "machine" is a network namespace
// this program makes; the two machines of a setup are joined by a veth
// pair (wanName), their underlay.
var (
	// k3sm: two nodes, each its own dataplane with its host namespace.
	meshWAN     = [2]netip.Addr{netip.MustParseAddr("10.251.0.1"), netip.MustParseAddr("10.251.0.2")}
	clusterCIDR = netip.MustParsePrefix("100.64.0.0/16")
	nodeCIDRs   = [2]netip.Prefix{netip.MustParsePrefix("100.64.0.0/24"), netip.MustParsePrefix("100.64.1.0/24")}

	// The bare tunnel: wireguard-go on a TUN link in each namespace.
	bareWAN    = [2]netip.Addr{netip.MustParseAddr("10.253.0.1"), netip.MustParseAddr("10.253.0.2")}
	bareTunnel = [2]netip.Addr{netip.MustParseAddr("10.252.0.1"), netip.MustParseAddr("10.252.0.2")}
)

const (
	wanBits    = 24
	listenPort = 51820
	keepalive  = 25 * time.Second
	bareDevice = "wg0"
)

// cleanups runs its functions in reverse order and joins their errors.
type cleanups []func() error

func (c *cleanups) add(f func() error) { *c = append(*c, f) }

func (c *cleanups) run() error {
	var errs []error
	for i := len(*c) - 1; i >= 0; i-- {
		if err := (*c)[i](); err != nil {
			errs = append(errs, err)
		}
	}
	*c = nil
	return errors.Join(errs...)
}

func newKey() (priv, pub [32]byte, err error) {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return priv, pub, err
	}
	return [32]byte(k.Bytes()), [32]byte(k.PublicKey().Bytes()), nil
}

// meshNode is one k3sm node: its host namespace and dataplane, its mesh
// device and its pods.
type meshNode struct {
	hostNS string
	dp     dataplane.Dataplane
	node   dataplane.Node
	mesh   dataplane.Mesh
	pub    [32]byte
	wan    netip.Addr
	pods   []dataplane.Pod
}

func (m *meshNode) mp() dataplane.MeshPlane { return m.dp.(dataplane.MeshPlane) }

func (m *meshNode) peer() dataplane.MeshPeer {
	return dataplane.MeshPeer{PublicKey: m.pub, Endpoint: netip.AddrPortFrom(m.wan, m.mesh.ListenPort), CIDR: m.node.CIDR, Keepalive: keepalive}
}

// meshCluster is the k3sm side: node A with pods A1 and A2, node B with
// pod B1.
type meshCluster struct {
	nodes      [2]*meshNode
	a1, a2, b1 dataplane.Pod
	setup      time.Duration // EnsureNode, AddPods, EnsureMesh and SetMeshPeers of both nodes
	device     string        // the mesh device's name, as EnsureMesh returned it
}

// buildMesh makes the two nodes in dir as k3sm-netd would: the dataplane
// on each node's host namespace, its bridge and pods, its mesh device,
// and the other node as its one peer. Everything it made is undone by cl.
func buildMesh(dir string, o options, cl *cleanups) (*meshCluster, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := &meshCluster{}
	for i, name := range []string{"node-a", "node-b"} {
		hostNS := filepath.Join(dir, name)
		if err := createNS(hostNS); err != nil {
			return nil, err
		}
		cl.add(func() error { return removeNS(hostNS) })
		podDir := filepath.Join(dir, name+"-pods")
		dp, err := dataplane.New(dataplane.Options{HostNSPath: hostNS, NetNSDir: podDir, Logger: log.With("node", name)})
		if err != nil {
			return nil, err
		}
		if _, ok := dp.(dataplane.MeshPlane); !ok {
			return nil, fmt.Errorf("the dataplane (%T) has no mesh", dp)
		}
		priv, pub, err := newKey()
		if err != nil {
			return nil, err
		}
		cidr := nodeCIDRs[i]
		n := &meshNode{
			hostNS: hostNS, dp: dp, pub: pub, wan: meshWAN[i],
			node: dataplane.Node{CIDR: cidr, Gateway: cidr.Addr().Next(), Bridge: "k3sm0", ClusterCIDR: clusterCIDR},
			mesh: dataplane.Mesh{Device: dataplane.MeshDevice, PrivateKey: dataplane.PrivateKey(priv), ListenPort: listenPort, MTU: o.mtu},
		}
		c.nodes[i] = n
	}
	if err := joinByVeth(c.nodes[0].hostNS, c.nodes[1].hostNS, meshWAN[0], meshWAN[1], wanBits); err != nil {
		return nil, err
	}
	pod := func(n *meshNode, uid string, ip netip.Addr) dataplane.Pod {
		p := dataplane.Pod{UID: uid, IP: ip, NetNS: filepath.Join(n.hostNS+"-pods", uid), HostIf: dataplane.HostIfName(uid)}
		n.pods = append(n.pods, p)
		return p
	}
	a, b := c.nodes[0], c.nodes[1]
	c.a1 = pod(a, "aaaaaaaa-0000-4000-8000-0000000000a1", a.node.Gateway.Next())
	c.a2 = pod(a, "aaaaaaaa-0000-4000-8000-0000000000a2", a.node.Gateway.Next().Next())
	c.b1 = pod(b, "bbbbbbbb-0000-4000-8000-0000000000b1", b.node.Gateway.Next())

	t0 := time.Now()
	// Each removal is queued before its call: they take what is missing
	// as removed, and undo what a call that failed half-way left.
	for _, n := range c.nodes {
		cl.add(func() error { return wrap("DelNode", n.dp.DelNode(n.node)) })
		if err := n.dp.EnsureNode(n.node); err != nil {
			return nil, fmt.Errorf("EnsureNode %v: %w", n.node.CIDR, err)
		}
		for _, p := range n.pods {
			cl.add(func() error { return wrap("DelPod "+p.UID, n.dp.DelPod(p)) })
			if err := n.dp.AddPod(n.node, p); err != nil {
				return nil, fmt.Errorf("AddPod %s: %w", p.UID, err)
			}
		}
		cl.add(func() error { return wrap("DelMesh", n.mp().DelMesh(n.node)) })
		dev, err := n.mp().EnsureMesh(n.node, n.mesh)
		if err != nil {
			return nil, fmt.Errorf("EnsureMesh on node %v: %w", n.node.CIDR, err)
		}
		c.device = dev
	}
	for i, n := range c.nodes {
		other := c.nodes[1-i]
		if err := n.mp().SetMeshPeers(n.node, n.mesh, []dataplane.MeshPeer{other.peer()}); err != nil {
			return nil, fmt.Errorf("SetMeshPeers on node %v: %w", n.node.CIDR, err)
		}
	}
	c.setup = time.Since(t0)
	return c, nil
}

func wrap(what string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// bareTun is the floor: two namespaces, each with wireguard-go on a TUN
// link of its own (bareDevice), configured through its UAPI (IpcSet) and
// peered with the other over the veth between them, nothing else: no
// bridge, no pods, no nftables.
type bareTun struct {
	ns    [2]string
	devs  [2]*device.Device
	setup time.Duration
}

func buildBare(dir string, o options, cl *cleanups) (*bareTun, error) {
	b := &bareTun{}
	for i, name := range []string{"bare-1", "bare-2"} {
		b.ns[i] = filepath.Join(dir, name)
		if err := createNS(b.ns[i]); err != nil {
			return nil, err
		}
		ns := b.ns[i]
		cl.add(func() error { return removeNS(ns) })
	}
	if err := joinByVeth(b.ns[0], b.ns[1], bareWAN[0], bareWAN[1], wanBits); err != nil {
		return nil, err
	}
	var privs, pubs [2][32]byte
	for i := range 2 {
		var err error
		if privs[i], pubs[i], err = newKey(); err != nil {
			return nil, err
		}
	}
	t0 := time.Now()
	for i := range 2 {
		ns := b.ns[i]
		logger := &device.Logger{
			Verbosef: device.DiscardLogf,
			Errorf: func(format string, args ...any) {
				fmt.Fprintf(os.Stderr, "bench/mesh: bare wireguard-go %d: %s\n", i+1, fmt.Sprintf(format, args...))
			},
		}
		// The TUN link, its netlink listener and the device's MTU query
		// are the namespace's when made on a thread inside it.
		var dev *device.Device
		err := isolated.OnThread(ns, func() error {
			t, err := tun.CreateTUN(bareDevice, o.mtu)
			if err != nil {
				return err
			}
			dev = device.NewDevice(newNSTUN(t, ns), conn.NewDefaultBind(), logger)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("TUN %s in %s: %w", bareDevice, filepath.Base(ns), err)
		}
		b.devs[i] = dev
		cl.add(func() error { dev.Close(); return nil })
		var cfg strings.Builder
		fmt.Fprintf(&cfg, "private_key=%s\nlisten_port=%d\n", hex.EncodeToString(privs[i][:]), listenPort)
		fmt.Fprintf(&cfg, "public_key=%s\nendpoint=%s\npersistent_keepalive_interval=%d\nreplace_allowed_ips=true\nallowed_ip=%s\n",
			hex.EncodeToString(pubs[1-i][:]), netip.AddrPortFrom(bareWAN[1-i], listenPort), int(keepalive/time.Second),
			netip.PrefixFrom(bareTunnel[1-i], 32))
		if err := dev.IpcSet(cfg.String()); err != nil {
			return nil, fmt.Errorf("configure wireguard-go in %s: %w", filepath.Base(ns), err)
		}
		if err := addrUp(ns, bareDevice, netip.PrefixFrom(bareTunnel[i], 24)); err != nil {
			return nil, err
		}
		// Up opens the UDP sockets: on a thread inside the namespace.
		if err := isolated.OnThread(ns, dev.Up); err != nil {
			return nil, fmt.Errorf("wireguard-go up in %s: %w", filepath.Base(ns), err)
		}
	}
	b.setup = time.Since(t0)
	return b, nil
}

// nsTUN keeps wireguard-go from following the link's up and down events,
// as internal/netd/dataplane's own wrapper does for the mesh device: it
// would bring the device up (opening its UDP sockets) from whichever
// goroutine reads them, on a thread outside the namespace. The program
// brings the device up itself, on a thread inside. The MTU is read there
// too. It costs nothing per packet, and both sides of the comparison
// have it.
type nsTUN struct {
	tun.Device
	ns     string
	events chan tun.Event
}

func newNSTUN(t tun.Device, ns string) *nsTUN {
	w := &nsTUN{Device: t, ns: ns, events: make(chan tun.Event, 4)}
	go func() {
		defer close(w.events)
		for e := range t.Events() {
			if e &^= tun.EventUp | tun.EventDown; e != 0 {
				w.events <- e
			}
		}
	}()
	return w
}

func (w *nsTUN) Events() <-chan tun.Event { return w.events }

func (w *nsTUN) MTU() (mtu int, err error) {
	err = isolated.OnThread(w.ns, func() error {
		mtu, err = w.Device.MTU()
		return err
	})
	return mtu, err
}
