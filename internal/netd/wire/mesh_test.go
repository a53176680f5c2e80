package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// Two public keys in canonical base64.
var (
	keyA = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xa1}, 32))
	keyB = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xb2}, 32))
)

func meshReq(verb Verb) *Request { return &Request{Version: Version, Verb: verb} }

func peersReq(peers ...MeshPeer) *Request {
	r := meshReq(VerbSetMeshPeers)
	r.SetMeshPeers = &SetMeshPeersArgs{Peers: peers}
	return r
}

func TestMeshRoundTrip(t *testing.T) {
	cm := meshReq(VerbConfigureMesh)
	cm.ConfigureMesh = &ConfigureMeshArgs{KeyRef: "node-1", ListenPort: 51820}
	for _, r := range []*Request{
		cm,
		peersReq(MeshPeer{PublicKey: keyA, Endpoint: "192.0.2.10:51820", PodCIDR: "100.64.1.0/24"},
			MeshPeer{PublicKey: keyB, Endpoint: "[2001:db8::1]:51820", PodCIDR: "100.64.2.0/24"}),
		peersReq(), // no peers
		meshReq(VerbMeshStatus),
		meshReq(VerbRemoveMesh),
	} {
		var buf bytes.Buffer
		if err := WriteRequest(&buf, r); err != nil {
			t.Fatalf("%s: %v", r.Verb, err)
		}
		got, err := ReadRequest(&buf)
		if err != nil {
			t.Fatalf("%s: %v", r.Verb, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("got %+v, want %+v", got, r)
		}
	}
	resp := &Response{Version: Version, Mesh: &MeshResult{Device: "k3sm-wg", PublicKey: keyA, ListenPort: 51820, MTU: MeshMTU,
		Peers: []MeshPeerStatus{{PublicKey: keyB, Endpoint: "192.0.2.11:51820", PodCIDR: "100.64.2.0/24", LastHandshake: 1700000000, RxBytes: 1, TxBytes: 2}}}}
	var buf bytes.Buffer
	if err := WriteResponse(&buf, resp); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadResponse(&buf); err != nil || !reflect.DeepEqual(got, resp) {
		t.Fatalf("%+v %v", got, err)
	}
}

// Every refusal names the field at fault.
func TestMeshValidate(t *testing.T) {
	peer := func(key, ep, cidr string) MeshPeer { return MeshPeer{PublicKey: key, Endpoint: ep, PodCIDR: cidr} }
	ok := peer(keyA, "192.0.2.10:51820", "100.64.1.0/24")
	cm := func(ref string, port uint16) *Request {
		r := meshReq(VerbConfigureMesh)
		r.ConfigureMesh = &ConfigureMeshArgs{KeyRef: ref, ListenPort: port}
		return r
	}
	tooMany := make([]MeshPeer, MaxMeshPeers+1)
	for i := range tooMany {
		k := make([]byte, 32)
		k[0], k[1] = byte(i), byte(i>>8)
		tooMany[i] = peer(base64.StdEncoding.EncodeToString(k), "192.0.2.10:51820", fmt.Sprintf("10.%d.%d.0/28", i/16, i%16*16))
	}
	short := base64.StdEncoding.EncodeToString(make([]byte, 31))
	// 32 zero bytes with the padding bits of the last character set: the
	// lenient decoder takes it, the strict one does not.
	badPad := strings.TrimSuffix(base64.StdEncoding.EncodeToString(make([]byte, 32)), "A=") + "B="
	for name, tc := range map[string]struct {
		r    *Request
		want string
	}{
		"configureMesh missing":   {meshReq(VerbConfigureMesh), `"configureMesh" arguments`},
		"configureMesh and other": {func() *Request { r := cm("a", 1); r.SetMeshPeers = &SetMeshPeersArgs{}; return r }(), `"configureMesh" arguments`},
		"keyRef empty":            {cm("", 1), "keyRef"},
		"keyRef path":             {cm("../etc", 1), "keyRef"},
		"keyRef upper":            {cm("Node", 1), "keyRef"},
		"keyRef dot":              {cm("a.key", 1), "keyRef"},
		"keyRef long":             {cm(strings.Repeat("a", 33), 1), "keyRef"},
		"listenPort 0":            {cm("a", 0), "listenPort"},
		"status with args":        {func() *Request { r := meshReq(VerbMeshStatus); r.SetMeshPeers = &SetMeshPeersArgs{}; return r }(), "takes no arguments"},
		"remove with args":        {func() *Request { r := meshReq(VerbRemoveMesh); r.ConfigureMesh = &ConfigureMeshArgs{}; return r }(), "takes no arguments"},
		"peers missing":           {meshReq(VerbSetMeshPeers), `"setMeshPeers" arguments`},
		"peers empty list":        {&Request{Version: Version, Verb: VerbSetMeshPeers, SetMeshPeers: &SetMeshPeersArgs{Peers: []MeshPeer{}}}, "empty list"},
		"too many":                {peersReq(tooMany...), fmt.Sprintf("at most %d", MaxMeshPeers)},
		"key not base64":          {peersReq(peer("not base64!", ok.Endpoint, ok.PodCIDR)), "peer 0: publicKey"},
		"key short":               {peersReq(peer(short, ok.Endpoint, ok.PodCIDR)), "publicKey: \"" + short + "\" is 31 bytes"},
		"key padding bits":        {peersReq(peer(badPad, ok.Endpoint, ok.PodCIDR)), "publicKey"},
		"key newline":             {peersReq(peer(keyA[:10]+"\n"+keyA[10:], ok.Endpoint, ok.PodCIDR)), "publicKey"},
		"key twice":               {peersReq(ok, peer(keyA, "192.0.2.11:1", "100.64.2.0/24")), "peer 1: publicKey " + keyA + " is peer 0's too"},
		"endpoint no port":        {peersReq(peer(keyA, "192.0.2.10", ok.PodCIDR)), "peer 0: endpoint"},
		"endpoint port 0":         {peersReq(peer(keyA, "192.0.2.10:0", ok.PodCIDR)), "endpoint: 192.0.2.10:0: port 0"},
		"endpoint unspecified":    {peersReq(peer(keyA, "0.0.0.0:51820", ok.PodCIDR)), "endpoint: 0.0.0.0:51820"},
		"endpoint v6 unspecified": {peersReq(peer(keyA, "[::]:51820", ok.PodCIDR)), "endpoint"},
		"endpoint multicast":      {peersReq(peer(keyA, "224.0.0.1:51820", ok.PodCIDR)), "endpoint"},
		"endpoint name":           {peersReq(peer(keyA, "node-2:51820", ok.PodCIDR)), "endpoint"},
		"endpoint zone":           {peersReq(peer(keyA, "[fe80::1%eth0]:51820", ok.PodCIDR)), "endpoint"},
		"endpoint not canonical":  {peersReq(peer(keyA, "192.0.2.10:051820", ok.PodCIDR)), "canonical"},
		"endpoint 4in6":           {peersReq(peer(keyA, "[::ffff:192.0.2.10]:51820", ok.PodCIDR)), "endpoint"},
		"podCIDR v6":              {peersReq(peer(keyA, ok.Endpoint, "fd00::/64")), "peer 0: podCIDR"},
		"podCIDR host bits":       {peersReq(peer(keyA, ok.Endpoint, "100.64.1.1/24")), "podCIDR"},
		"podCIDR too big":         {peersReq(peer(keyA, ok.Endpoint, "100.0.0.0/8")), "podCIDR"},
		"podCIDR too small":       {peersReq(peer(keyA, ok.Endpoint, "100.64.1.0/30")), "podCIDR"},
		"podCIDR overlap":         {peersReq(ok, peer(keyB, ok.Endpoint, "100.64.0.0/16")), "peer 1: podCIDR 100.64.0.0/16 overlaps peer 0's 100.64.1.0/24"},
	} {
		err := tc.r.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
		var buf bytes.Buffer
		if err := WriteRequest(&buf, tc.r); err == nil {
			t.Errorf("%s: WriteRequest sent an invalid request", name)
		}
		// And ReadRequest refuses the same frame, still in step (an empty
		// list has no JSON of its own: omitempty leaves it out).
		body, _ := jsonBody(tc.r)
		if name == "peers empty list" {
			body = `{"version":1,"verb":"SetMeshPeers","setMeshPeers":{"peers":[]}}`
		}
		if _, err := ReadRequest(bytes.NewReader(frame(body))); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: ReadRequest = %v, want ErrMalformed", name, err)
		}
	}
	if got, err := ParseMeshPeers(&SetMeshPeersArgs{Peers: []MeshPeer{ok}}); err != nil || len(got) != 1 || got[0].PodCIDR.String() != ok.PodCIDR || got[0].Endpoint.String() != ok.Endpoint || got[0].PublicKey != [32]byte(bytes.Repeat([]byte{0xa1}, 32)) {
		t.Fatalf("ParseMeshPeers = %+v %v", got, err)
	}
}

func jsonBody(r *Request) (string, error) {
	b, err := json.Marshal(r)
	return string(b), err
}
