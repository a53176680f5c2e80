package mesh

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	netv1 "github.com/k3sm-dev/k3sm/api/net/v1"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Public keys (standard base64 of 32 bytes).
const (
	keyA = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
	keyB = "TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0="
	keyC = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
	keyD = "gN65BkIKy1eCE9pP1wdc8ROUtkHLF2PfAqYdyYBz6EA="
)

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// meshPeer is node's MeshPeer as that node would publish it.
func meshPeer(t *testing.T, node, key, endpoint, podCIDR string) *unstructured.Unstructured {
	t.Helper()
	cidr := netip.MustParsePrefix(podCIDR)
	u, err := netv1.ToUnstructured(&netv1.MeshPeer{ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec: netv1.NewSpec(node, key, netip.MustParseAddrPort(endpoint), cidr)})
	if err != nil {
		t.Fatal(err)
	}
	delete(u.Object, "status")
	return u
}

func objs(us ...*unstructured.Unstructured) []any {
	out := make([]any, len(us))
	for i, u := range us {
		out[i] = u
	}
	return out
}

func TestPeerSet(t *testing.T) {
	own := netip.MustParsePrefix("10.42.0.0/24")
	cluster := netip.MustParsePrefix("10.42.0.0/16")
	self := meshPeer(t, "a", keyA, "192.168.1.10:51820", "10.42.0.0/24")
	b := meshPeer(t, "b", keyB, "192.168.1.11:51820", "10.42.1.0/24")
	c := meshPeer(t, "c", keyC, "[fd00::12]:51820", "10.42.2.0/24")
	badKey := meshPeer(t, "d", keyD, "192.168.1.13:51820", "10.42.3.0/24")
	_ = unstructured.SetNestedField(badKey.Object, "not-a-key", "spec", "publicKey")
	incomplete := meshPeer(t, "e", keyD, "192.168.1.14:51820", "10.42.4.0/24")
	unstructured.RemoveNestedField(incomplete.Object, "spec", "endpoint")
	overlapsOwn := meshPeer(t, "f", keyD, "192.168.1.15:51820", "10.42.0.0/25")
	sameKey := meshPeer(t, "g", keyB, "192.168.1.16:51820", "10.42.6.0/24")
	overlapsB := meshPeer(t, "h", keyD, "192.168.1.17:51820", "10.42.1.128/25")
	outside := meshPeer(t, "i", "Ok9Gc7jmCgwuH8YFnhmRe1ItRwcoaqkyvxIOVYd1pnA=", "192.168.1.18:51820", "10.43.0.0/24")
	claimsSelf := meshPeer(t, "j", keyD, "192.168.1.19:51820", "10.42.9.0/24")
	_ = unstructured.SetNestedField(claimsSelf.Object, "a", "spec", "nodeName")
	selfKey := meshPeer(t, "k", keyA, "192.168.1.20:51820", "10.42.10.0/24")
	garbled := meshPeer(t, "l", keyD, "192.168.1.21:51820", "10.42.11.0/24")
	_ = unstructured.SetNestedField(garbled.Object, "10.42.11.0/24", "spec", "allowedIPs")

	peers, skipped := peerSet(objs(overlapsB, c, self, badKey, incomplete, overlapsOwn, sameKey, b, outside, claimsSelf, selfKey, garbled),
		"a", keyA, own, cluster)
	want := []peer{
		{"b", wire.MeshPeer{PublicKey: keyB, Endpoint: "192.168.1.11:51820", PodCIDR: "10.42.1.0/24"}},
		{"c", wire.MeshPeer{PublicKey: keyC, Endpoint: "[fd00::12]:51820", PodCIDR: "10.42.2.0/24"}},
	}
	if !reflect.DeepEqual(peers, want) {
		t.Errorf("peers %+v, want %+v", peers, want)
	}
	wantSkipped := map[string]string{
		"d": "publicKey", "e": "endpoint", "f": "overlaps this node's", "g": "has the public key of meshpeers/b",
		"h": "overlaps meshpeers/b's", "i": "outside the cluster's", "j": "metadata.name", "k": "this node's public key",
		"l": `MeshPeer "l"`, // cannot be decoded
	}
	for name, why := range wantSkipped {
		if !strings.Contains(skipped[name], why) {
			t.Errorf("%s skipped for %q, want a reason with %q", name, skipped[name], why)
		}
	}
	if len(skipped) != len(wantSkipped) {
		t.Errorf("skipped %v: the node's own must not be listed", skipped)
	}

	// Without a cluster range, only that check goes.
	peers, _ = peerSet(objs(b, outside), "a", keyA, own, netip.Prefix{})
	if len(peers) != 2 {
		t.Errorf("without a cluster range: %+v", peers)
	}
	// No MeshPeers, or only its own: no peers, nothing skipped.
	if peers, skipped := peerSet(objs(self), "a", keyA, own, cluster); len(peers) != 0 || len(skipped) != 0 {
		t.Errorf("alone: %+v %v", peers, skipped)
	}
}

func TestPeerSetLimit(t *testing.T) {
	var us []*unstructured.Unstructured
	for i := range wire.MaxMeshPeers + 2 {
		name := "n" + string(rune('a'+i/26/26%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i%26))
		key := make([]byte, 32)
		key[0], key[1] = byte(i), byte(i>>8)
		u := meshPeer(t, name, keyFromBytes(key), "192.168.1.1:51820",
			netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i/256), byte(i), 0}), 24).String())
		us = append(us, u)
	}
	peers, skipped := peerSet(objs(us...), "a", keyA, netip.MustParsePrefix("10.42.0.0/24"), netip.Prefix{})
	if len(peers) != wire.MaxMeshPeers || len(skipped) != 2 {
		t.Errorf("%d peers, %d skipped (%v); want %d and 2", len(peers), len(skipped), skipped, wire.MaxMeshPeers)
	}
}

func TestPeerStatus(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	pushed := []peer{{"b", wire.MeshPeer{PublicKey: keyB}}, {"c", wire.MeshPeer{PublicKey: keyC}}, {"d", wire.MeshPeer{PublicKey: keyD}}}
	device := []wire.MeshPeerStatus{
		{PublicKey: keyB, LastHandshake: now.Add(-10 * time.Second).Unix()},
		{PublicKey: keyC, LastHandshake: now.Add(-netv1.ReachableWithin - time.Second).Unix()},
		{PublicKey: keyD}, // never
		{PublicKey: keyA, LastHandshake: now.Unix()}, // not a peer it was given
	}
	at := func(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(d)); return &t }
	got := peerStatus(pushed, device, now)
	want := netv1.MeshPeerStatus{LastHandshakeTime: at(-10 * time.Second), Reachable: false, Peers: []netv1.PeerStatus{
		{NodeName: "b", LastHandshakeTime: at(-10 * time.Second), Reachable: true},
		{NodeName: "c", LastHandshakeTime: at(-netv1.ReachableWithin - time.Second), Reachable: false},
		{NodeName: "d"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("status\n got %+v\nwant %+v", got, want)
	}

	if got := peerStatus(nil, nil, now); !got.Reachable || got.LastHandshakeTime != nil || got.Peers != nil {
		t.Errorf("no peers: %+v, want reachable with nothing else", got)
	}
	got = peerStatus(pushed[:1], device, now)
	if !got.Reachable || len(got.Peers) != 1 || !got.Peers[0].Reachable {
		t.Errorf("one reachable peer: %+v", got)
	}
	// A peer the device does not have (yet) is not reachable.
	if got := peerStatus(pushed[:1], nil, now); got.Reachable || got.Peers[0].Reachable || got.Peers[0].LastHandshakeTime != nil {
		t.Errorf("peer unknown to the device: %+v", got)
	}
}

// fakeNetd records the mesh verbs.
type fakeNetd struct {
	mu         sync.Mutex
	key        string
	configures []wire.ConfigureMeshArgs
	sets       [][]wire.MeshPeer
	status     []wire.MeshPeerStatus
	failSet    error
}

func (f *fakeNetd) result() wire.MeshResult {
	return wire.MeshResult{Device: "k3sm-wg", PublicKey: f.key, ListenPort: 51820, MTU: wire.MeshMTU,
		Peers: append([]wire.MeshPeerStatus(nil), f.status...)}
}

func (f *fakeNetd) ConfigureMesh(_ context.Context, a wire.ConfigureMeshArgs) (wire.MeshResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.configures = append(f.configures, a)
	return f.result(), nil
}

func (f *fakeNetd) SetMeshPeers(_ context.Context, peers []wire.MeshPeer) (wire.MeshResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failSet != nil {
		return wire.MeshResult{}, f.failSet
	}
	f.sets = append(f.sets, append([]wire.MeshPeer(nil), peers...))
	return f.result(), nil
}

func (f *fakeNetd) MeshStatus(context.Context) (wire.MeshResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.result(), nil
}

// lastSet returns the endpoints' nodes of the last SetMeshPeers, by pod
// range, and how many calls there were.
func (f *fakeNetd) lastSet() ([]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sets) == 0 {
		return nil, 0
	}
	var cidrs []string
	for _, p := range f.sets[len(f.sets)-1] {
		cidrs = append(cidrs, p.PodCIDR)
	}
	return cidrs, len(f.sets)
}

type harness struct {
	t    *testing.T
	dyn  *dynamicfake.FakeDynamicClient
	kube *fake.Clientset
	netd *fakeNetd
	m    *Mesh
}

// start runs a Mesh of node "a" (pod range 10.42.0.0/24) over fakes that
// hold peers, until the test ends. netd (nil: a new one) is its netd.
func start(t *testing.T, resync time.Duration, now func() time.Time, netd *fakeNetd, peers ...*unstructured.Unstructured) *harness {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: "uid-a"}, Spec: corev1.NodeSpec{PodCIDR: "10.42.0.0/24"}}
	kube := fake.NewClientset(node)
	var os []runtime.Object
	for _, p := range peers {
		os = append(os, p)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{netv1.MeshPeerGVR: netv1.ListKind}, os...)
	// An informer misses what changes between its list and its watch on a
	// fake client: tests change things once the watch is there.
	var watching sync.WaitGroup
	watching.Add(1)
	once := sync.OnceFunc(watching.Done)
	dyn.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
		once()
		return false, nil, nil
	})
	if netd == nil {
		netd = &fakeNetd{}
	}
	netd.key = keyA
	m := New(Config{Dynamic: dyn, Nodes: kube.CoreV1().Nodes(), NodeName: "a", NodeIP: "192.168.1.10",
		ClusterCIDR: "10.42.0.0/16", Netd: netd, Log: testLog(t), Resync: resync})
	if now != nil {
		m.now = now
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	watching.Wait()
	return &harness{t: t, dyn: dyn, kube: kube, netd: netd, m: m}
}

func (h *harness) get(name string) (*netv1.MeshPeer, error) {
	u, err := h.dyn.Resource(netv1.MeshPeerGVR).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return netv1.FromUnstructured(u)
}

func (h *harness) waitSet(what string, want ...string) {
	h.t.Helper()
	poll.Until(h.t, 10*time.Second, what, func() bool {
		got, n := h.netd.lastSet()
		return n > 0 && strings.Join(got, ",") == strings.Join(want, ",")
	})
}

func (h *harness) statusWrites() int {
	n := 0
	for _, a := range h.dyn.Actions() {
		if a.GetVerb() == "update" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

func TestRunPublishesAndFollows(t *testing.T) {
	b := meshPeer(t, "b", keyB, "192.168.1.11:51820", "10.42.1.0/24")
	h := start(t, time.Hour, nil, nil, b) // no resync: events alone drive it
	ctx := context.Background()

	var own *netv1.MeshPeer
	poll.UntilNil(t, 10*time.Second, "the node's MeshPeer", func() (err error) {
		own, err = h.get("a")
		return err
	})
	wantSpec := netv1.MeshPeerSpec{NodeName: "a", PublicKey: keyA, Endpoint: "192.168.1.10:51820", PodCIDR: "10.42.0.0/24",
		AllowedIPs: []string{"10.42.0.0/24"}, MeshIP: "10.42.0.1", PersistentKeepalive: 25}
	if !reflect.DeepEqual(own.Spec, wantSpec) {
		t.Errorf("spec %+v, want %+v", own.Spec, wantSpec)
	}
	wantOwner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "a", UID: "uid-a"}}
	if !reflect.DeepEqual(own.OwnerReferences, wantOwner) {
		t.Errorf("ownerReferences %+v, want %+v", own.OwnerReferences, wantOwner)
	}
	h.netd.mu.Lock()
	if len(h.netd.configures) == 0 || h.netd.configures[0] != (wire.ConfigureMeshArgs{KeyRef: "node", ListenPort: 51820}) {
		t.Errorf("ConfigureMesh %+v", h.netd.configures)
	}
	h.netd.mu.Unlock()
	h.waitSet("b given to the device", "10.42.1.0/24")

	// A new node; a peer turned invalid is dropped, the others kept.
	c := meshPeer(t, "c", keyC, "192.168.1.12:51820", "10.42.2.0/24")
	if _, err := h.dyn.Resource(netv1.MeshPeerGVR).Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitSet("c added", "10.42.1.0/24", "10.42.2.0/24")
	_ = unstructured.SetNestedField(b.Object, "nowhere", "spec", "endpoint")
	if _, err := h.dyn.Resource(netv1.MeshPeerGVR).Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitSet("invalid b dropped, c kept", "10.42.2.0/24")

	// Someone deletes the node's MeshPeer: it comes back, owned by the Node.
	if err := h.dyn.Resource(netv1.MeshPeerGVR).Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.UntilNil(t, 10*time.Second, "the node's MeshPeer made again", func() (err error) {
		own, err = h.get("a")
		return err
	})
	if !reflect.DeepEqual(own.Spec, wantSpec) || !reflect.DeepEqual(own.OwnerReferences, wantOwner) {
		t.Errorf("made again as %+v", own)
	}

	// Someone changes its spec: it is put back.
	u, _ := h.dyn.Resource(netv1.MeshPeerGVR).Get(ctx, "a", metav1.GetOptions{})
	_ = unstructured.SetNestedField(u.Object, "192.168.9.9:1", "spec", "endpoint")
	u.SetOwnerReferences(nil)
	if _, err := h.dyn.Resource(netv1.MeshPeerGVR).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the node's MeshPeer put back", func() bool {
		own, err := h.get("a")
		return err == nil && reflect.DeepEqual(own.Spec, wantSpec) && reflect.DeepEqual(own.OwnerReferences, wantOwner)
	})
}

// The Node is registered again (new UID) and its MeshPeer deleted by the
// garbage collector: the new one is owned by the new Node.
func TestRunNewNodeUID(t *testing.T) {
	h := start(t, time.Hour, nil, nil)
	ctx := context.Background()
	poll.UntilNil(t, 10*time.Second, "the node's MeshPeer", func() error { _, err := h.get("a"); return err })
	n, _ := h.kube.CoreV1().Nodes().Get(ctx, "a", metav1.GetOptions{})
	n.UID = "uid-a2"
	if _, err := h.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.dyn.Resource(netv1.MeshPeerGVR).Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the MeshPeer owned by the new Node", func() bool {
		own, err := h.get("a")
		return err == nil && len(own.OwnerReferences) == 1 && own.OwnerReferences[0].UID == "uid-a2"
	})
}

func TestRunStatus(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	b := meshPeer(t, "b", keyB, "192.168.1.11:51820", "10.42.1.0/24")
	c := meshPeer(t, "c", keyC, "192.168.1.12:51820", "10.42.2.0/24")
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := start(t, 20*time.Millisecond, clock,
		&fakeNetd{status: []wire.MeshPeerStatus{{PublicKey: keyB, LastHandshake: now.Add(-time.Minute).Unix()}, {PublicKey: keyC}}}, b, c)

	var own *netv1.MeshPeer
	poll.Until(t, 10*time.Second, "the status written", func() bool {
		var err error
		own, err = h.get("a")
		return err == nil && len(own.Status.Peers) == 2
	})
	hs := metav1.NewTime(now.Add(-time.Minute))
	want := netv1.MeshPeerStatus{LastHandshakeTime: &hs, Reachable: false, Peers: []netv1.PeerStatus{
		{NodeName: "b", LastHandshakeTime: &hs, Reachable: true}, {NodeName: "c"}}}
	if !own.Status.LastHandshakeTime.Equal(&hs) || !own.Status.Peers[0].LastHandshakeTime.Equal(&hs) {
		t.Errorf("handshake times %v %v, want %v", own.Status.LastHandshakeTime, own.Status.Peers[0].LastHandshakeTime, hs)
	}
	own.Status.LastHandshakeTime, own.Status.Peers[0].LastHandshakeTime = &hs, &hs
	if !reflect.DeepEqual(own.Status, want) {
		t.Errorf("status %+v, want %+v", own.Status, want)
	}

	// Nothing changes: many resyncs, no more writes.
	writes := h.statusWrites()
	_, sets := h.netd.lastSet()
	poll.Until(t, 10*time.Second, "ten more resyncs", func() bool { _, n := h.netd.lastSet(); return n >= sets+10 })
	if n := h.statusWrites(); n != writes {
		t.Errorf("%d status writes while nothing changed", n-writes)
	}

	// c handshakes: one more write, and the node is reachable.
	h.netd.mu.Lock()
	h.netd.status[1].LastHandshake = now.Unix()
	h.netd.mu.Unlock()
	poll.Until(t, 10*time.Second, "the node reachable", func() bool {
		own, err := h.get("a")
		return err == nil && own.Status.Reachable && own.Status.Peers[1].Reachable
	})
	// Time passes without handshakes: unreachable again.
	mu.Lock()
	now = now.Add(netv1.ReachableWithin + time.Minute)
	mu.Unlock()
	poll.Until(t, 10*time.Second, "the node unreachable", func() bool {
		own, err := h.get("a")
		return err == nil && !own.Status.Reachable && !own.Status.Peers[0].Reachable && !own.Status.Peers[1].Reachable
	})
}

// A SetMeshPeers that fails is retried; the status says nothing until the
// device has its peers.
func TestRunRetriesPeers(t *testing.T) {
	b := meshPeer(t, "b", keyB, "192.168.1.11:51820", "10.42.1.0/24")
	h := start(t, time.Hour, nil, &fakeNetd{failSet: errors.New("netd restarting")}, b)
	poll.UntilNil(t, 10*time.Second, "the node's MeshPeer", func() error { _, err := h.get("a"); return err })
	if _, n := h.netd.lastSet(); n != 0 {
		t.Fatal("SetMeshPeers succeeded while failing")
	}
	h.netd.mu.Lock()
	h.netd.failSet = nil
	h.netd.mu.Unlock()
	h.waitSet("b given once netd answers", "10.42.1.0/24")
}

func TestRunChecksConfig(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), Nodes: fake.NewClientset().CoreV1().Nodes(), Netd: &fakeNetd{}, NodeName: "a", NodeIP: "0.0.0.0"},
		{Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), Nodes: fake.NewClientset().CoreV1().Nodes(), Netd: &fakeNetd{}, NodeName: "a", NodeIP: "node-a"},
		{Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), Nodes: fake.NewClientset().CoreV1().Nodes(), Netd: &fakeNetd{}, NodeName: "a", NodeIP: "10.0.0.1", ClusterCIDR: "x"},
	} {
		if err := New(cfg).Run(context.Background()); err == nil {
			t.Errorf("Run with %+v: no error", cfg)
		}
	}
}

func keyFromBytes(b []byte) string {
	return base64.StdEncoding.EncodeToString(b)
}

// A peer's first handshake shows in the status within seconds, not at the
// next resync: until every peer is reachable the status is checked again
// soon (1 s, 2 s, ...).
func TestRunStatusSoon(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	b := meshPeer(t, "b", keyB, "192.168.1.11:51820", "10.42.1.0/24")
	h := start(t, time.Hour, func() time.Time { return now }, &fakeNetd{status: []wire.MeshPeerStatus{{PublicKey: keyB}}}, b)
	poll.Until(t, 10*time.Second, "the status written, b not reachable", func() bool {
		own, err := h.get("a")
		return err == nil && len(own.Status.Peers) == 1 && !own.Status.Reachable
	})
	h.netd.mu.Lock()
	h.netd.status[0].LastHandshake = now.Unix()
	h.netd.mu.Unlock()
	poll.Until(t, 30*time.Second, "b reachable without a resync", func() bool {
		own, err := h.get("a")
		return err == nil && own.Status.Reachable
	})
}
