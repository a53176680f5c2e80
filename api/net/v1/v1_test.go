package v1

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const key = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="

func validPeer() *MeshPeer {
	return &MeshPeer{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Spec:       NewSpec("node-a", key, netip.MustParseAddrPort("192.168.1.10:51820"), netip.MustParsePrefix("10.42.1.0/24")),
	}
}

func TestNewSpec(t *testing.T) {
	s := NewSpec("node-a", key, netip.MustParseAddrPort("[fd00::1]:51820"), netip.MustParsePrefix("10.42.1.0/24"))
	want := MeshPeerSpec{NodeName: "node-a", PublicKey: key, Endpoint: "[fd00::1]:51820", PodCIDR: "10.42.1.0/24",
		AllowedIPs: []string{"10.42.1.0/24"}, MeshIP: "10.42.1.1", PersistentKeepalive: 25}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("NewSpec = %+v, want %+v", s, want)
	}
	if err := ValidateSpec(&s); err != nil {
		t.Error(err)
	}
}

func TestRoundTrip(t *testing.T) {
	hs := metav1.NewTime(time.Unix(1700000000, 0))
	p := validPeer()
	p.UID = "u1"
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "node-a", UID: "n1"}}
	p.Status = MeshPeerStatus{LastHandshakeTime: &hs, Reachable: true,
		Peers: []PeerStatus{{NodeName: "node-b", LastHandshakeTime: &hs, Reachable: true}, {NodeName: "node-c"}}}
	u, err := ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	if u.GetAPIVersion() != "net.k3sm.io/v1" || u.GetKind() != "MeshPeer" || p.Kind != "" {
		t.Errorf("apiVersion %q kind %q (and the original's kind %q: it must not change)", u.GetAPIVersion(), u.GetKind(), p.Kind)
	}
	if got, _, _ := unstructured.NestedString(u.Object, "spec", "podCIDR"); got != "10.42.1.0/24" {
		t.Errorf("spec.podCIDR = %q", got)
	}
	if got, _, _ := unstructured.NestedString(u.Object, "status", "lastHandshakeTime"); got != "2023-11-14T22:13:20Z" {
		t.Errorf("status.lastHandshakeTime = %q", got)
	}
	back, err := FromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	p.APIVersion, p.Kind = "net.k3sm.io/v1", "MeshPeer"
	if !back.Status.LastHandshakeTime.Equal(p.Status.LastHandshakeTime) {
		t.Errorf("lastHandshakeTime %v, want %v", back.Status.LastHandshakeTime, p.Status.LastHandshakeTime)
	}
	back.Status.LastHandshakeTime, p.Status.LastHandshakeTime = nil, nil
	back.Status.Peers[0].LastHandshakeTime, p.Status.Peers[0].LastHandshakeTime = nil, nil
	if !reflect.DeepEqual(back, p) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, p)
	}

	u.SetKind("Node")
	if _, err := FromUnstructured(u); err == nil {
		t.Error("FromUnstructured took a Node")
	}
	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "net.k3sm.io/v1", "kind": "MeshPeer",
		"metadata": map[string]any{"name": "x"}, "spec": map[string]any{"allowedIPs": "10.0.0.0/24"}}}
	if _, err := FromUnstructured(bad); err == nil {
		t.Error("FromUnstructured took a string for allowedIPs")
	}
}

func TestDeepCopy(t *testing.T) {
	hs := metav1.NewTime(time.Unix(1700000000, 0))
	p := validPeer()
	p.Labels = map[string]string{"a": "b"}
	p.Status.LastHandshakeTime = &hs
	p.Status.Peers = []PeerStatus{{NodeName: "node-b", LastHandshakeTime: &hs}}
	c := p.DeepCopyObject().(*MeshPeer)
	if !reflect.DeepEqual(c, p) {
		t.Fatalf("copy differs: %+v", c)
	}
	c.Labels["a"] = "c"
	c.Spec.AllowedIPs[0] = "x"
	c.Status.LastHandshakeTime.Time = time.Unix(0, 0)
	c.Status.Peers[0].NodeName = "y"
	c.Status.Peers[0].LastHandshakeTime.Time = time.Unix(0, 0)
	if p.Labels["a"] != "b" || p.Spec.AllowedIPs[0] != "10.42.1.0/24" || !p.Status.LastHandshakeTime.Equal(&hs) ||
		p.Status.Peers[0].NodeName != "node-b" || !p.Status.Peers[0].LastHandshakeTime.Equal(&hs) {
		t.Errorf("changing the copy changed the original: %+v", p)
	}
	l := &MeshPeerList{Items: []MeshPeer{*p}}
	lc := l.DeepCopyObject().(*MeshPeerList)
	lc.Items[0].Spec.AllowedIPs[0] = "x"
	if p.Spec.AllowedIPs[0] != "10.42.1.0/24" {
		t.Error("changing the list's copy changed the original")
	}
	if (*MeshPeer)(nil).DeepCopy() != nil || (*MeshPeerList)(nil).DeepCopy() != nil {
		t.Error("copy of nil is not nil")
	}
}

// invalidSpecs are specs Validate refuses, each with what its error names.
// mutate changes a valid peer; crd says whether the CRD refuses it too.
var invalidSpecs = []struct {
	name   string
	mutate func(p *MeshPeer)
	want   string
	crd    bool
}{
	{"name is not nodeName", func(p *MeshPeer) { p.Name = "node-b" }, "metadata.name", true},
	{"no nodeName", func(p *MeshPeer) { p.Spec.NodeName = ""; p.Name = "" }, "nodeName", true},
	{"nodeName not a DNS name", func(p *MeshPeer) { p.Spec.NodeName = "Node_A"; p.Name = "Node_A" }, "nodeName", true},
	{"no key", func(p *MeshPeer) { p.Spec.PublicKey = "" }, "publicKey", true},
	{"short key", func(p *MeshPeer) { p.Spec.PublicKey = key[:40] + "AA=" }, "publicKey", true},
	{"key not base64", func(p *MeshPeer) { p.Spec.PublicKey = "*" + key[1:] }, "publicKey", true},
	{"key with stray bits", func(p *MeshPeer) { p.Spec.PublicKey = key[:42] + "h=" }, "publicKey", true},
	{"key of 33 bytes", func(p *MeshPeer) { p.Spec.PublicKey = key[:43] + "A" }, "publicKey", true},
	{"no endpoint", func(p *MeshPeer) { p.Spec.Endpoint = "" }, "endpoint", true},
	{"hostname endpoint", func(p *MeshPeer) { p.Spec.Endpoint = "node-a.example:51820" }, "endpoint", true},
	{"no port", func(p *MeshPeer) { p.Spec.Endpoint = "192.168.1.10" }, "endpoint", true},
	{"port 0", func(p *MeshPeer) { p.Spec.Endpoint = "192.168.1.10:0" }, "endpoint", true},
	{"port too big", func(p *MeshPeer) { p.Spec.Endpoint = "192.168.1.10:65536" }, "endpoint", true},
	{"bad IPv4", func(p *MeshPeer) { p.Spec.Endpoint = "192.168.1.300:51820" }, "endpoint", true},
	{"unspecified", func(p *MeshPeer) { p.Spec.Endpoint = "0.0.0.0:51820" }, "endpoint", true},
	{"IPv6 without brackets", func(p *MeshPeer) { p.Spec.Endpoint = "fd00::1:51820" }, "endpoint", true},
	{"IPv4 in brackets", func(p *MeshPeer) { p.Spec.Endpoint = "[192.168.1.10]:51820" }, "endpoint", true},
	{"IPv4-mapped", func(p *MeshPeer) { p.Spec.Endpoint = "[::ffff:192.168.1.10]:51820" }, "endpoint", true},
	{"zone", func(p *MeshPeer) { p.Spec.Endpoint = "[fe80::1%eth0]:51820" }, "endpoint", true},
	{"no podCIDR", func(p *MeshPeer) { p.Spec.PodCIDR = ""; p.Spec.AllowedIPs = []string{""} }, "podCIDR", true},
	{"podCIDR host bits", func(p *MeshPeer) { p.Spec.PodCIDR = "10.42.1.1/24"; p.Spec.AllowedIPs = []string{"10.42.1.1/24"} }, "podCIDR", true},
	{"podCIDR /32", func(p *MeshPeer) {
		p.Spec.PodCIDR, p.Spec.AllowedIPs, p.Spec.MeshIP = "10.42.1.0/32", []string{"10.42.1.0/32"}, "10.42.1.0"
	}, "podCIDR", true},
	{"allowedIPs another range", func(p *MeshPeer) { p.Spec.AllowedIPs = []string{"10.42.2.0/24"} }, "allowedIPs", true},
	{"allowedIPs more", func(p *MeshPeer) { p.Spec.AllowedIPs = []string{"10.42.1.0/24", "0.0.0.0/0"} }, "allowedIPs", true},
	{"no allowedIPs", func(p *MeshPeer) { p.Spec.AllowedIPs = nil }, "allowedIPs", true},
	{"no meshIP", func(p *MeshPeer) { p.Spec.MeshIP = "" }, "meshIP", true},
	{"meshIP outside", func(p *MeshPeer) { p.Spec.MeshIP = "10.42.2.1" }, "meshIP", true},
	{"meshIP not the first", func(p *MeshPeer) { p.Spec.MeshIP = "10.42.1.7" }, "meshIP", false},
	{"keepalive negative", func(p *MeshPeer) { p.Spec.PersistentKeepalive = -1 }, "persistentKeepalive", true},
	{"keepalive too big", func(p *MeshPeer) { p.Spec.PersistentKeepalive = 65536 }, "persistentKeepalive", true},
}

// validSpecs are variations Validate and the CRD accept.
var validSpecs = []struct {
	name   string
	mutate func(p *MeshPeer)
}{
	{"as made", func(*MeshPeer) {}},
	{"IPv6 endpoint", func(p *MeshPeer) { p.Spec.Endpoint = "[fd00::10]:1" }},
	{"port 65535", func(p *MeshPeer) { p.Spec.Endpoint = "10.0.0.1:65535" }},
	{"dotted node name", func(p *MeshPeer) { p.Name, p.Spec.NodeName = "node-a.example.com", "node-a.example.com" }},
	{"IPv6 pod range", func(p *MeshPeer) {
		p.Spec.PodCIDR, p.Spec.AllowedIPs, p.Spec.MeshIP = "fd42:0:0:1::/64", []string{"fd42:0:0:1::/64"}, "fd42:0:0:1::1"
	}},
	{"no keepalive", func(p *MeshPeer) { p.Spec.PersistentKeepalive = 0 }},
}

func TestValidate(t *testing.T) {
	for _, tc := range validSpecs {
		p := validPeer()
		tc.mutate(p)
		if err := Validate(p); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	for _, tc := range invalidSpecs {
		p := validPeer()
		tc.mutate(p)
		err := Validate(p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one about %s", tc.name, err, tc.want)
		}
	}
}
