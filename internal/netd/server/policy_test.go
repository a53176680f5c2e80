package server

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

func setPolicy(t *testing.T, sock string, a wire.SetPolicyArgs) *wire.Response {
	return call(t, sock, wire.Request{Verb: wire.VerbSetPolicy, SetPolicy: &a})
}

// SetPolicy reaches the data path typed, only for pods netd owns, and
// goes with the pod.
func TestSetPolicy(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	args := wire.SetPolicyArgs{UID: uidN(1),
		Ingress: wire.PolicyDirection{Isolated: true, Rules: []wire.PolicyRule{{
			Peers: []wire.PolicyPeer{{CIDR: "100.64.0.0/24", Except: []string{"100.64.0.9/32"}}},
			Ports: []wire.PolicyPort{{Protocol: "TCP", Port: 8080}, {Protocol: "SCTP", Port: 10, EndPort: 20}},
		}}},
		Egress: wire.PolicyDirection{Isolated: true}}
	wantCode(t, setPolicy(t, e.sock, args), wire.CodeNotFound, uidN(1))
	ok(t, setup(t, e.sock, uidN(1)))
	ok(t, setPolicy(t, e.sock, args))
	got, _ := e.dp.policy(uidN(1))
	want := dataplane.Policy{
		Ingress: dataplane.Direction{Isolated: true, Rules: []dataplane.Rule{{
			Peers: []dataplane.Peer{{CIDR: netip.MustParsePrefix("100.64.0.0/24"), Except: []netip.Prefix{netip.MustParsePrefix("100.64.0.9/32")}}},
			Ports: []dataplane.Port{{Protocol: dataplane.TCP, Port: 8080}, {Protocol: dataplane.SCTP, Port: 10, EndPort: 20}},
		}}},
		Egress: dataplane.Direction{Isolated: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("data path got %+v, want %+v", got, want)
	}
	// Refused before the data path: not a valid policy.
	bad := args
	bad.Egress = wire.PolicyDirection{Rules: []wire.PolicyRule{{}}}
	wantCode(t, setPolicy(t, e.sock, bad), wire.CodeInvalid, "egress")

	e.dp.mu.Lock()
	e.dp.failPol = dataplane.ErrPolicyUnsupported
	e.dp.mu.Unlock()
	wantCode(t, setPolicy(t, e.sock, args), wire.CodeUnsupported, "default/p-"+uidN(1))
	e.dp.mu.Lock()
	e.dp.failPol = nil
	e.dp.mu.Unlock()

	ok(t, teardown(t, e.sock, uidN(1)))
	if _, ok := e.dp.policy(uidN(1)); ok {
		t.Fatal("policy left after teardown")
	}
	wantCode(t, setPolicy(t, e.sock, args), wire.CodeNotFound)
}
