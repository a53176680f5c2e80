package daemon

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	netdclient "github.com/k3sm-dev/k3sm/internal/netd/client"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

func TestWirePolicy(t *testing.T) {
	req := &runtimev1.SetPodNetworkPolicyRequest{PodUid: "ab-12", Policy: &runtimev1.PodNetworkPolicy{
		Ingress: &runtimev1.NetworkPolicyDirection{Isolated: true, Rules: []*runtimev1.NetworkPolicyRule{
			{Peers: []*runtimev1.NetworkPolicyPeer{{Cidr: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}, {Cidr: "100.64.0.2/32"}},
				Ports: []*runtimev1.NetworkPolicyPort{{Protocol: "TCP", Port: 80, EndPort: 90}}},
			{},
		}},
	}}
	got, err := wirePolicy(req)
	want := wire.SetPolicyArgs{UID: "ab-12", Ingress: wire.PolicyDirection{Isolated: true, Rules: []wire.PolicyRule{
		{Peers: []wire.PolicyPeer{{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}, {CIDR: "100.64.0.2/32"}},
			Ports: []wire.PolicyPort{{Protocol: "TCP", Port: 80, EndPort: 90}}},
		{},
	}}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v %v, want %+v", got, err, want)
	}
	// What netd's client would send must validate: no empty lists.
	r := wire.Request{Version: wire.Version, Verb: wire.VerbSetPolicy, SetPolicy: &got}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	req.Policy.Ingress.Rules[0].Ports[0].Port = 70000
	if _, err := wirePolicy(req); err == nil {
		t.Fatal("port 70000 accepted")
	}
	if a, err := wirePolicy(&runtimev1.SetPodNetworkPolicyRequest{PodUid: "ab"}); err != nil || a.Ingress.Isolated || a.Egress.Rules != nil {
		t.Fatalf("no policy: %+v %v", a, err)
	}
}

func TestNetdStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{&netdclient.Error{Code: wire.CodeNotFound}, codes.NotFound},
		{&netdclient.Error{Code: wire.CodeUnsupported}, codes.Unimplemented},
		{&netdclient.Error{Code: wire.CodeInvalid}, codes.InvalidArgument},
		{&netdclient.Error{Code: wire.CodeInternal}, codes.Internal},
		{errors.New("dial unix: no such file"), codes.Unavailable},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
	} {
		if got := status.Code(netdStatus(tc.err)); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.err, got, tc.want)
		}
	}
	var s server
	_, err := s.SetPodNetworkPolicy(context.Background(), &runtimev1.SetPodNetworkPolicyRequest{PodUid: "ab"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("without a pod network: %v", err)
	}
}
