package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"reflect"
	"testing"
)

// FuzzReadRequest feeds the root process's parser arbitrary bytes: it must
// not panic, and whatever it accepts must survive a round trip unchanged
// and still validate.
func FuzzReadRequest(f *testing.F) {
	for _, body := range []string{
		`{"version":1,"verb":"Configure","configure":{"podCIDR":"100.64.0.0/24"}}`,
		`{"version":1,"verb":"SetupPod","setupPod":{"uid":"` + uid + `","namespace":"default","name":"web-0"}}`,
		`{"version":1,"verb":"TeardownPod","teardownPod":{"uid":"` + uid + `"}}`,
		`{"version":1,"verb":"ListPods"}`,
		`{"version":1,"verb":"SetPolicy","setPolicy":{"uid":"` + uid + `","ingress":{"isolated":true,"rules":[{"peers":[{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}],"ports":[{"protocol":"TCP","port":80,"endPort":90}]}]},"egress":{}}}`,
		`{"version":1,"verb":"SetPolicy","setPolicy":{"uid":"` + uid + `","ingress":{"rules":[{}]},"egress":{}}}`,
		`{"version":1,"verb":"SetServices","setServices":{"generation":7,"chunk":0,"final":true,"services":[{"protocol":"TCP","ip":"10.43.0.10","port":80,"endpoints":[{"ip":"100.64.0.5","port":8080},{"ip":"100.64.0.6","port":8080}]},{"protocol":"UDP","ip":"10.43.0.10","port":53}]}}`,
		`{"version":1,"verb":"SetServices","setServices":{"generation":1,"chunk":3}}`,
		`{"version":1,"verb":"SetServices","setServices":{"generation":2,"chunk":0,"final":true,"services":[{"protocol":"TCP","ip":"192.168.1.5","port":30080,"nodePort":true,"local":true,"endpoints":[{"ip":"100.64.0.5","port":8080}]},{"protocol":"UDP","ip":"192.168.1.5","port":53,"loadBalancer":true},{"protocol":"TCP","ip":"192.168.1.5","port":80,"nodePort":true,"external":true}]}}`,
		`{"version":1,"verb":"SetServices","setServices":{"generation":1,"chunk":0,"services":[{"protocol":"SCTP","ip":"10.43.0.1","port":1}]}}`,
		`{"version":1,"verb":"SetServices","setServices":{"generation":1,"chunk":0,"services":[{"protocol":"TCP","ip":"010.43.0.1","port":1,"endpoints":[]}]}}`,
		`{"version":1,"verb":"ConfigureMesh","configureMesh":{"keyRef":"node-1","listenPort":51820}}`,
		`{"version":1,"verb":"ConfigureMesh","configureMesh":{"keyRef":"../x","listenPort":0}}`,
		`{"version":1,"verb":"SetMeshPeers","setMeshPeers":{"peers":[{"publicKey":"oaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaE=","endpoint":"192.0.2.10:51820","podCIDR":"100.64.1.0/24"},{"publicKey":"srKysrKysrKysrKysrKysrKysrKysrKysrKysrKysrI=","endpoint":"[2001:db8::1]:51820","podCIDR":"100.64.2.0/24"}]}}`,
		`{"version":1,"verb":"SetMeshPeers","setMeshPeers":{}}`,
		`{"version":1,"verb":"SetMeshPeers","setMeshPeers":{"peers":[]}}`,
		`{"version":1,"verb":"SetMeshPeers","setMeshPeers":{"peers":[{"publicKey":"oaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaF=","endpoint":"0.0.0.0:1","podCIDR":"100.64.1.1/24"}]}}`,
		`{"version":1,"verb":"MeshStatus"}`,
		`{"version":1,"verb":"RemoveMesh"}`,
		`{"version":1,"verb":"RemoveMesh","setMeshPeers":{}}`,
		`{"version":1,"verb":"ListPods"} {}`,
		`{"version":1,"verb":"SetupPod","setupPod":{"uid":"A","namespace":"x","name":"y","z":1}}`,
		`{"version":2,"verb":"ListPods"}`,
		`{"VERSION":1,"Verb":"ListPods"}`,
		`{"version":1,"verb":"Configure","configure":{"podCIDR":"10.0.0.1/24"}}`,
		`null`, `[]`, `"x"`, ``,
	} {
		f.Add(frame(body))
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(binary.BigEndian.AppendUint32(nil, 10))
	f.Add([]byte{0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ReadRequest(bytes.NewReader(data))
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted an invalid request: %v", err)
		}
		var buf bytes.Buffer
		if err := WriteRequest(&buf, r); err != nil {
			t.Fatalf("accepted request does not re-encode: %v", err)
		}
		again, err := ReadRequest(&buf)
		if err != nil {
			t.Fatalf("re-encoded request refused: %v", err)
		}
		if !reflect.DeepEqual(r, again) {
			t.Fatalf("round trip changed %+v to %+v", r, again)
		}
	})
}

// FuzzMeshRequest builds the mesh verbs' requests from arbitrary field
// values, which whole-frame mutation rarely reaches: whatever validates
// reaches netd through ReadRequest unchanged, and its peers are in the
// one spelling netd records and compares (keys, endpoints and ranges
// re-encode to the text sent).
func FuzzMeshRequest(f *testing.F) {
	f.Add("node-1", uint16(51820), "oaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaE=", "192.0.2.10:51820", "100.64.1.0/24", "srKysrKysrKysrKysrKysrKysrKysrKysrKysrKysrI=", "[2001:db8::1]:1", "100.64.2.0/28")
	f.Add("", uint16(0), "oaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaF=", "0.0.0.0:1", "100.64.1.1/24", "oaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaE=", "[fe80::1%eth0]:1", "100.64.0.0/16")
	f.Fuzz(func(t *testing.T, ref string, port uint16, key1, ep1, cidr1, key2, ep2, cidr2 string) {
		peers := []MeshPeer{{PublicKey: key1, Endpoint: ep1, PodCIDR: cidr1}, {PublicKey: key2, Endpoint: ep2, PodCIDR: cidr2}}
		for _, r := range []*Request{
			{Version: Version, Verb: VerbConfigureMesh, ConfigureMesh: &ConfigureMeshArgs{KeyRef: ref, ListenPort: port}},
			{Version: Version, Verb: VerbSetMeshPeers, SetMeshPeers: &SetMeshPeersArgs{Peers: peers[:1]}},
			{Version: Version, Verb: VerbSetMeshPeers, SetMeshPeers: &SetMeshPeersArgs{Peers: peers}},
		} {
			if r.Validate() != nil {
				continue
			}
			var buf bytes.Buffer
			if err := WriteRequest(&buf, r); err != nil {
				t.Fatalf("valid request does not encode: %v", err)
			}
			got, err := ReadRequest(&buf)
			if err != nil {
				t.Fatalf("valid request refused: %v", err)
			}
			if !reflect.DeepEqual(got, r) {
				t.Fatalf("round trip changed %+v to %+v", r, got)
			}
			if r.SetMeshPeers == nil {
				continue
			}
			parsed, err := ParseMeshPeers(r.SetMeshPeers)
			if err != nil || len(parsed) != len(r.SetMeshPeers.Peers) {
				t.Fatalf("ParseMeshPeers of a valid request: %v", err)
			}
			for i, p := range parsed {
				in := r.SetMeshPeers.Peers[i]
				if base64.StdEncoding.EncodeToString(p.PublicKey[:]) != in.PublicKey || p.Endpoint.String() != in.Endpoint || p.PodCIDR.String() != in.PodCIDR {
					t.Fatalf("peer %d %+v parsed as %+v: not its one spelling", i, in, p)
				}
			}
		}
	})
}
