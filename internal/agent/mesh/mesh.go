// Package mesh owns the node's place in the WireGuard mesh: its own
// MeshPeer (api/net/v1) and the device's peers. k3sm-netd owns the device
// and the private key; this package asks it to bring the device up
// (ConfigureMesh, which answers with the public key), publishes the node's
// MeshPeer (its key, endpoint and pod range, owned by its Node so the
// garbage collector deletes it with the Node), hands the device every
// other node's valid MeshPeer (SetMeshPeers), and writes what the device
// knows of them into its MeshPeer's status. It does all of it again every
// Resync, so a restarted netd is repaired and a deleted MeshPeer comes
// back. No private key passes through it.
package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"time"

	netv1 "github.com/k3sm-dev/k3sm/api/net/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/trim"
	"github.com/k3sm-dev/k3sm/internal/backoff"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// Netd is the part of k3sm-netd's client the mesh uses.
type Netd interface {
	ConfigureMesh(ctx context.Context, a wire.ConfigureMeshArgs) (wire.MeshResult, error)
	SetMeshPeers(ctx context.Context, peers []wire.MeshPeer) (wire.MeshResult, error)
	MeshStatus(ctx context.Context) (wire.MeshResult, error)
}

// Defaults for Config's zero values.
const (
	DefaultListenPort = 51820
	DefaultKeyRef     = "node"
	DefaultResync     = 30 * time.Second
)

// netdTimeout bounds one call to netd.
const netdTimeout = 30 * time.Second

// Config is what the mesh needs.
type Config struct {
	// Dynamic reads and writes MeshPeers.
	Dynamic dynamic.Interface
	// Nodes reads the node's own Node (its spec.podCIDR and UID).
	Nodes typedcorev1.NodeInterface
	// NodeName is this node's name, and its MeshPeer's.
	NodeName string
	// NodeIP is the address the other nodes reach this one at: the host
	// of its endpoint.
	NodeIP string
	// ListenPort is the device's UDP port (DefaultListenPort).
	ListenPort uint16
	// KeyRef names the node's private key in netd (DefaultKeyRef).
	KeyRef string
	// ClusterCIDR, when set, is the cluster's pod range: a peer whose pod
	// range is outside it is skipped (netd would refuse the whole set).
	ClusterCIDR string
	Netd        Netd
	Log         *slog.Logger
	// Resync is how often everything is done again (DefaultResync).
	Resync time.Duration
}

// Mesh keeps the node's MeshPeer and its device's peers. Its state is
// touched only by Run's goroutine.
type Mesh struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	nodeIP  netip.Addr
	cluster netip.Prefix // invalid: not checked

	podCIDR netip.Prefix
	device  wire.MeshResult // the last ConfigureMesh's answer
	nodeUID types.UID       // the owner of the node's MeshPeer
	store   cache.Store     // every MeshPeer

	pushed   []peer // what the device was last given
	pushedOK bool   // the device has pushed
	skipped  map[string]string
	// settled: the status was written since the peers last changed, and
	// it found every peer reachable. Until then it is checked again soon
	// (1 s, 2 s, ... every 10 s), so a new node shows reachable within
	// seconds of its first handshake, not at the next Resync.
	settled bool
}

// peer is another node's MeshPeer as the device takes it.
type peer struct {
	name string
	wire.MeshPeer
}

// New returns a Mesh for cfg, defaults filled in; Run checks cfg.
func New(cfg Config) *Mesh {
	if cfg.ListenPort == 0 {
		cfg.ListenPort = DefaultListenPort
	}
	if cfg.KeyRef == "" {
		cfg.KeyRef = DefaultKeyRef
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	return &Mesh{cfg: cfg, log: log, now: time.Now, skipped: map[string]string{}}
}

func (m *Mesh) check() error {
	if m.cfg.Dynamic == nil || m.cfg.Nodes == nil || m.cfg.Netd == nil || m.cfg.NodeName == "" {
		return errors.New("mesh: Dynamic, Nodes, Netd and NodeName are required")
	}
	ip, err := netip.ParseAddr(m.cfg.NodeIP)
	if err != nil || ip.Zone() != "" || ip.Unmap().IsUnspecified() {
		return fmt.Errorf("mesh: node IP %q is not an address the other nodes can reach", m.cfg.NodeIP)
	}
	m.nodeIP = ip.Unmap()
	if m.cfg.ClusterCIDR != "" {
		if m.cluster, err = netip.ParsePrefix(m.cfg.ClusterCIDR); err != nil {
			return fmt.Errorf("mesh: cluster CIDR: %w", err)
		}
		m.cluster = m.cluster.Masked()
	}
	return nil
}

// Run keeps the node's place in the mesh until ctx ends. It waits for the
// Node's pod range and for the device (netd needs the pod network
// configured first), publishes the node's MeshPeer, then follows every
// MeshPeer. Errors after the start are logged and retried.
func (m *Mesh) Run(ctx context.Context) error {
	if err := m.check(); err != nil {
		return err
	}
	if err := m.waitPodCIDR(ctx); err != nil {
		return nilIfDone(ctx, err)
	}
	if err := m.retry(ctx, "mesh device not configured yet", m.configure); err != nil {
		return nilIfDone(ctx, err)
	}
	if err := m.retry(ctx, "MeshPeers not served yet (is the server's MeshPeer CRD installed?)", m.served); err != nil {
		return nilIfDone(ctx, err)
	}
	kick := make(chan struct{}, 1)
	inf := dynamicinformer.NewFilteredDynamicInformer(m.cfg.Dynamic, netv1.MeshPeerGVR, "", 0, cache.Indexers{}, nil).Informer()
	if err := inf.SetTransform(trim.ManagedFields); err != nil {
		return err
	}
	poke := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke}); err != nil {
		return err
	}
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	m.store = inf.GetStore()
	m.log.Info("mesh device up", "device", m.device.Device, "publicKey", m.device.PublicKey, "listenPort", m.device.ListenPort, "podCIDR", m.podCIDR.String())

	tick := time.NewTicker(m.cfg.Resync)
	defer tick.Stop()
	delay := backoff.Backoff{Initial: time.Second, Max: m.cfg.Resync}
	// Reading the device is local and a write happens only on change:
	// cheap enough every 10 s while a peer has not answered.
	soonDelay := backoff.Backoff{Initial: time.Second, Max: min(10*time.Second, m.cfg.Resync)}
	full, statusOnly := true, false
	for {
		var again, soon <-chan time.Time
		var err error
		if statusOnly {
			if err = m.updateStatus(ctx); err != nil {
				m.log.Warn("MeshPeer status not written", "err", err)
				err = nil // the next resync writes it
			}
		} else {
			err = m.sync(ctx, full)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			d := delay.Next()
			m.log.Warn("mesh sync failed; retrying", "in", d.String(), "err", err)
			again = time.After(d)
		} else {
			delay.Reset()
		}
		if m.pushedOK && !m.settled {
			soon = time.After(soonDelay.Next())
		} else {
			soonDelay.Reset()
		}
		statusOnly = false
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
			full = err != nil
		case <-tick.C:
			full = true
		case <-again:
			full = true
		case <-soon:
			statusOnly = true
		}
	}
}

func nilIfDone(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// retry calls f until it succeeds, backing off, and logs what (with f's
// error) every 30 s until then.
func (m *Mesh) retry(ctx context.Context, what string, f func(context.Context) error) error {
	delay := backoff.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second}
	warned := time.Now()
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if time.Since(warned) > 30*time.Second {
			warned = time.Now()
			m.log.Warn(what+"; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay.Next()):
		}
	}
}

// waitPodCIDR waits until the controller-manager gave the Node its pod
// range (set once, never changed).
func (m *Mesh) waitPodCIDR(ctx context.Context) error {
	return m.retry(ctx, "node has no spec.podCIDR yet: no mesh until it has", func(ctx context.Context) error {
		n, err := m.cfg.Nodes.Get(ctx, m.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Spec.PodCIDR == "" {
			return errors.New("no spec.podCIDR")
		}
		p, err := netv1.ParsePodCIDR(n.Spec.PodCIDR)
		if err != nil {
			return err
		}
		m.podCIDR, m.nodeUID = p, n.UID
		return nil
	})
}

// configure brings the device up (again: netd may have restarted) and
// learns its public key.
func (m *Mesh) configure(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, netdTimeout)
	defer cancel()
	res, err := m.cfg.Netd.ConfigureMesh(cctx, wire.ConfigureMeshArgs{KeyRef: m.cfg.KeyRef, ListenPort: m.cfg.ListenPort})
	if err != nil {
		return fmt.Errorf("ConfigureMesh: %w", err)
	}
	if err := netv1.ValidatePublicKey(res.PublicKey); err != nil {
		return fmt.Errorf("ConfigureMesh answered a bad key: %w", err)
	}
	if m.device.PublicKey != "" && m.device.PublicKey != res.PublicKey {
		m.log.Warn("the mesh device's public key changed (netd lost its key?): publishing the new one", "publicKey", res.PublicKey)
	}
	m.device = res
	return nil
}

// served checks that the API serves MeshPeers.
func (m *Mesh) served(ctx context.Context) error {
	_, err := m.cfg.Dynamic.Resource(netv1.MeshPeerGVR).List(ctx, metav1.ListOptions{Limit: 1})
	return err
}

// sync brings the node's MeshPeer and the device's peers up to date; full
// also configures the device again, gives it its peers even if they did
// not change, and updates the status.
func (m *Mesh) sync(ctx context.Context, full bool) error {
	if full {
		if err := m.configure(ctx); err != nil {
			return err
		}
	}
	var errs []error
	if !m.ownUpToDate() {
		if err := m.ensureOwn(ctx); err != nil {
			errs = append(errs, fmt.Errorf("MeshPeer %s: %w", m.cfg.NodeName, err))
		}
	}
	if err := m.pushPeers(ctx, full); err != nil {
		errs = append(errs, err)
	}
	if full {
		if err := m.updateStatus(ctx); err != nil {
			errs = append(errs, fmt.Errorf("MeshPeer %s status: %w", m.cfg.NodeName, err))
		}
	}
	return errors.Join(errs...)
}

// spec is what the node's MeshPeer says.
func (m *Mesh) spec() netv1.MeshPeerSpec {
	port := m.device.ListenPort
	if port == 0 {
		port = m.cfg.ListenPort
	}
	return netv1.NewSpec(m.cfg.NodeName, m.device.PublicKey, netip.AddrPortFrom(m.nodeIP, port), m.podCIDR)
}

// ownerRef makes the Node the owner of its MeshPeer: the garbage collector
// deletes the MeshPeer with the Node.
func (m *Mesh) ownerRef() metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: m.cfg.NodeName, UID: m.nodeUID}
}

// withOwner returns refs with the Node's reference in place of any other
// Node's.
func withOwner(refs []metav1.OwnerReference, own metav1.OwnerReference) []metav1.OwnerReference {
	out := []metav1.OwnerReference{own}
	for _, r := range refs {
		if !(r.APIVersion == "v1" && r.Kind == "Node") {
			out = append(out, r)
		}
	}
	return out
}

// upToDate says whether u is the node's MeshPeer as it should be.
func (m *Mesh) upToDate(u *unstructured.Unstructured) bool {
	p, err := netv1.FromUnstructured(u)
	if err != nil || !reflect.DeepEqual(p.Spec, m.spec()) || u.GetDeletionTimestamp() != nil {
		return false
	}
	return reflect.DeepEqual(withOwner(p.OwnerReferences, m.ownerRef()), p.OwnerReferences)
}

// ownUpToDate says whether the cache has the node's MeshPeer as it should
// be.
func (m *Mesh) ownUpToDate() bool {
	u := m.cached(m.cfg.NodeName)
	return u != nil && m.upToDate(u)
}

func (m *Mesh) cached(name string) *unstructured.Unstructured {
	if m.store == nil {
		return nil
	}
	obj, ok, err := m.store.GetByKey(name)
	if err != nil || !ok {
		return nil
	}
	u, _ := obj.(*unstructured.Unstructured)
	return u
}

// ensureOwn creates the node's MeshPeer, or updates its spec and owner.
// The Node is read again for its UID: a Node deleted and registered again
// is another owner.
func (m *Mesh) ensureOwn(ctx context.Context) error {
	n, err := m.cfg.Nodes.Get(ctx, m.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the Node: %w", err)
	}
	m.nodeUID = n.UID
	want := &netv1.MeshPeer{
		ObjectMeta: metav1.ObjectMeta{Name: m.cfg.NodeName, Labels: map[string]string{"app.kubernetes.io/managed-by": "k3sm"},
			OwnerReferences: []metav1.OwnerReference{m.ownerRef()}},
		Spec: m.spec(),
	}
	if err := netv1.Validate(want); err != nil {
		return err
	}
	wantU, err := netv1.ToUnstructured(want)
	if err != nil {
		return err
	}
	delete(wantU.Object, "status") // the status subresource's, written apart
	res := m.cfg.Dynamic.Resource(netv1.MeshPeerGVR)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := res.Get(ctx, m.cfg.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if _, err = res.Create(ctx, wantU, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(netv1.MeshPeerGVR.GroupResource(), m.cfg.NodeName, err)
			} else if err == nil {
				m.log.Info("MeshPeer created", "name", m.cfg.NodeName, "endpoint", want.Spec.Endpoint, "podCIDR", want.Spec.PodCIDR)
			}
			return err
		} else if err != nil {
			return err
		}
		if have.GetDeletionTimestamp() != nil {
			// Being deleted (its Node was?): made again once it is gone.
			return fmt.Errorf("being deleted")
		}
		if m.upToDate(have) {
			return nil
		}
		upd := have.DeepCopy()
		upd.Object["spec"] = wantU.Object["spec"]
		upd.SetOwnerReferences(withOwner(have.GetOwnerReferences(), m.ownerRef()))
		labels := upd.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels["app.kubernetes.io/managed-by"] = "k3sm"
		upd.SetLabels(labels)
		if _, err := res.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return err
		}
		m.log.Info("MeshPeer updated", "name", m.cfg.NodeName, "endpoint", want.Spec.Endpoint, "podCIDR", want.Spec.PodCIDR)
		return nil
	})
}

// pushPeers gives the device every other node's valid MeshPeer: when the
// set changed, or always when force.
func (m *Mesh) pushPeers(ctx context.Context, force bool) error {
	var objs []any
	if m.store != nil {
		objs = m.store.List()
	}
	peers, skipped := peerSet(objs, m.cfg.NodeName, m.device.PublicKey, m.podCIDR, m.cluster)
	m.logSkipped(skipped)
	if !force && m.pushedOK && reflect.DeepEqual(peers, m.pushed) {
		return nil
	}
	set := make([]wire.MeshPeer, len(peers))
	for i, p := range peers {
		set[i] = p.MeshPeer
	}
	cctx, cancel := context.WithTimeout(ctx, netdTimeout)
	defer cancel()
	if _, err := m.cfg.Netd.SetMeshPeers(cctx, set); err != nil {
		m.pushedOK = false
		return fmt.Errorf("SetMeshPeers: %w", err)
	}
	if !m.pushedOK || !reflect.DeepEqual(peers, m.pushed) {
		names := make([]string, len(peers))
		for i, p := range peers {
			names[i] = p.name
		}
		m.log.Info("mesh peers", "count", len(peers), "nodes", strings.Join(names, ","))
		m.settled = false
	}
	m.pushed, m.pushedOK = peers, true
	return nil
}

// logSkipped logs each skipped MeshPeer once per reason.
func (m *Mesh) logSkipped(skipped map[string]string) {
	for name, why := range skipped {
		if m.skipped[name] != why {
			m.log.Warn("MeshPeer skipped: not given to the mesh device", "name", name, "reason", why)
		}
	}
	m.skipped = skipped
}

// peerSet returns, by name, the MeshPeers of objs the device can take:
// every other node's that is valid, and not in conflict with this node
// (self, selfKey, own: its name, public key and pod range) or with a peer
// before it by name (the same key, overlapping pod ranges). A pod range
// outside cluster (when valid) is skipped too: netd refuses it. skipped
// says why each other one was left out; this node's own is neither.
func peerSet(objs []any, self, selfKey string, own, cluster netip.Prefix) (peers []peer, skipped map[string]string) {
	skipped = map[string]string{}
	var all []*netv1.MeshPeer
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		if u.GetName() == self {
			continue
		}
		p, err := netv1.FromUnstructured(u)
		if err != nil {
			skipped[u.GetName()] = err.Error()
			continue
		}
		all = append(all, p)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	keys := map[string]string{}
	var ranges []netip.Prefix
	var rangeOwners []string
	for _, p := range all {
		why := ""
		cidr, _ := netip.ParsePrefix(p.Spec.PodCIDR)
		switch err := netv1.Validate(p); {
		case err != nil:
			why = strings.ReplaceAll(err.Error(), "\n", "; ")
		case p.Spec.NodeName == self:
			why = "names this node"
		case p.Spec.PublicKey == selfKey:
			why = "has this node's public key"
		case keys[p.Spec.PublicKey] != "":
			why = "has the public key of meshpeers/" + keys[p.Spec.PublicKey]
		case cidr.Overlaps(own):
			why = "podCIDR " + p.Spec.PodCIDR + " overlaps this node's " + own.String()
		case cluster.IsValid() && !(cluster.Contains(cidr.Addr()) && cidr.Bits() >= cluster.Bits()):
			why = "podCIDR " + p.Spec.PodCIDR + " is outside the cluster's " + cluster.String()
		case len(peers) >= wire.MaxMeshPeers:
			why = fmt.Sprintf("more than %d peers", wire.MaxMeshPeers)
		}
		if why == "" {
			for i, r := range ranges {
				if r.Overlaps(cidr) {
					why = "podCIDR " + p.Spec.PodCIDR + " overlaps meshpeers/" + rangeOwners[i] + "'s " + r.String()
					break
				}
			}
		}
		if why != "" {
			skipped[p.Name] = why
			continue
		}
		keys[p.Spec.PublicKey] = p.Name
		ranges, rangeOwners = append(ranges, cidr), append(rangeOwners, p.Name)
		ep, _ := netv1.ParseEndpoint(p.Spec.Endpoint)
		peers = append(peers, peer{name: p.Name, MeshPeer: wire.MeshPeer{PublicKey: p.Spec.PublicKey, Endpoint: ep.String(), PodCIDR: cidr.String()}})
	}
	return peers, skipped
}

// peerStatus is the node's MeshPeer status from what the device knows of
// the peers it was given: a peer is reachable when its last handshake is
// within netv1.ReachableWithin of now; the node when every peer is.
func peerStatus(pushed []peer, device []wire.MeshPeerStatus, now time.Time) netv1.MeshPeerStatus {
	byKey := make(map[string]wire.MeshPeerStatus, len(device))
	for _, d := range device {
		byKey[d.PublicKey] = d
	}
	s := netv1.MeshPeerStatus{Reachable: true}
	for _, p := range pushed {
		ps := netv1.PeerStatus{NodeName: p.name}
		if d, ok := byKey[p.PublicKey]; ok && d.LastHandshake > 0 {
			t := metav1.NewTime(time.Unix(d.LastHandshake, 0))
			ps.LastHandshakeTime = &t
			ps.Reachable = now.Sub(t.Time) <= netv1.ReachableWithin
			if s.LastHandshakeTime == nil || t.After(s.LastHandshakeTime.Time) {
				s.LastHandshakeTime = t.DeepCopy()
			}
		}
		s.Reachable = s.Reachable && ps.Reachable
		s.Peers = append(s.Peers, ps)
	}
	return s
}

// updateStatus writes what the device knows of its peers into the node's
// MeshPeer status, when that changed.
func (m *Mesh) updateStatus(ctx context.Context) error {
	if !m.pushedOK {
		return nil // the device's peers are not known: nothing true to say
	}
	cctx, cancel := context.WithTimeout(ctx, netdTimeout)
	dev, err := m.cfg.Netd.MeshStatus(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("MeshStatus: %w", err)
	}
	want := peerStatus(m.pushed, dev.Peers, m.now())
	wantU, err := netv1.StatusToUnstructured(&want)
	if err != nil {
		return err
	}
	res := m.cfg.Dynamic.Resource(netv1.MeshPeerGVR)
	have := m.cached(m.cfg.NodeName)
	current := false // the API holds want
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if have == nil {
			return nil // not there (yet): written next time
		}
		p, err := netv1.FromUnstructured(have)
		if err == nil && equality.Semantic.DeepEqual(p.Status, want) {
			current = true
			return nil
		}
		upd := have.DeepCopy()
		upd.Object["status"] = wantU
		_, err = res.UpdateStatus(ctx, upd, metav1.UpdateOptions{})
		current = err == nil
		if apierrors.IsConflict(err) {
			// The cache is behind: compare with the API's copy.
			if fresh, gerr := res.Get(ctx, m.cfg.NodeName, metav1.GetOptions{}); gerr == nil {
				have = fresh
			} else if apierrors.IsNotFound(gerr) {
				have = nil
			}
		}
		return err
	})
	m.settled = current && want.Reachable
	return err
}
