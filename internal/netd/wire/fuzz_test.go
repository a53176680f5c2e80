package wire

import (
	"bytes"
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
