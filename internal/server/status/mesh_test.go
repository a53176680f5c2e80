package status

import (
	"strings"
	"testing"
	"time"

	netv1 "github.com/k3sm-dev/k3sm/api/net/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func meshList(t *testing.T, peers ...*netv1.MeshPeer) *unstructured.UnstructuredList {
	t.Helper()
	l := &unstructured.UnstructuredList{}
	for _, p := range peers {
		u, err := netv1.ToUnstructured(p)
		if err != nil {
			t.Fatal(err)
		}
		l.Items = append(l.Items, *u)
	}
	return l
}

func meshPeer(name string, st netv1.MeshPeerStatus) *netv1.MeshPeer {
	return &netv1.MeshPeer{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:   netv1.MeshPeerSpec{NodeName: name, PublicKey: strings.Repeat("A", 43) + "=", Endpoint: "192.0.2.1:51820", PodCIDR: "100.64.0.0/24", AllowedIPs: []string{"100.64.0.0/24"}, MeshIP: "100.64.0.1"},
		Status: st}
}

// The mesh is reported healthy only when the node's own MeshPeer exists
// and its device had a recent handshake with every other node's.
func TestMeshHealth(t *testing.T) {
	now := metav1.NewTime(time.Now())
	for _, tc := range []struct {
		name   string
		list   *unstructured.UnstructuredList
		health string
		detail string
	}{
		{"no own MeshPeer", meshList(t, meshPeer("b", netv1.MeshPeerStatus{})), "", "has no MeshPeer"},
		{"alone", meshList(t, meshPeer("a", netv1.MeshPeerStatus{Reachable: true})), OK, "no other node"},
		{"all reachable", meshList(t, meshPeer("a", netv1.MeshPeerStatus{Reachable: true, Peers: []netv1.PeerStatus{{NodeName: "b", Reachable: true, LastHandshakeTime: &now}}}),
			meshPeer("b", netv1.MeshPeerStatus{})), OK, "1 peers"},
		{"one never", meshList(t, meshPeer("a", netv1.MeshPeerStatus{Peers: []netv1.PeerStatus{{NodeName: "b"}}}),
			meshPeer("b", netv1.MeshPeerStatus{})), Impaired, "b (never)"},
		{"a peer skipped", meshList(t, meshPeer("a", netv1.MeshPeerStatus{Reachable: true}), meshPeer("b", netv1.MeshPeerStatus{})), Impaired, "has 0 peers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, d, err := meshHealth(tc.list, "a", 51820)
			if tc.health == "" {
				if err == nil || !strings.Contains(err.Error(), tc.detail) {
					t.Fatalf("err %v, want one saying %q", err, tc.detail)
				}
				return
			}
			if err != nil || h != tc.health || !strings.Contains(d, tc.detail) {
				t.Fatalf("got %s %q %v, want %s with %q", h, d, err, tc.health, tc.detail)
			}
		})
	}
}
