package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

const uid = "0b7a3f2e-5c1d-4e8f-9a6b-1c2d3e4f5a6b"

func frame(body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

func TestRoundTrip(t *testing.T) {
	for _, r := range []*Request{
		{Version: Version, Verb: VerbConfigure, Configure: &ConfigureArgs{PodCIDR: "100.64.0.0/24"}},
		{Version: Version, Verb: VerbSetupPod, SetupPod: &SetupPodArgs{UID: uid, Namespace: "kube-system", Name: "coredns-7d4f.x"}},
		{Version: Version, Verb: VerbTeardownPod, TeardownPod: &TeardownPodArgs{UID: uid}},
		{Version: Version, Verb: VerbListPods},
		{Version: Version, Verb: VerbSetPolicy, SetPolicy: &SetPolicyArgs{UID: uid, Ingress: PolicyDirection{Isolated: true, Rules: []PolicyRule{
			{Peers: []PolicyPeer{{CIDR: "100.64.0.2/32"}, {CIDR: "0.0.0.0/0", Except: []string{"10.0.0.0/8"}}}, Ports: []PolicyPort{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 5000, EndPort: 5999}}},
			{},
		}}}},
		{Version: Version, Verb: VerbSetPolicy, SetPolicy: &SetPolicyArgs{UID: uid}},
		{Version: Version, Verb: VerbSetServices, SetServices: &SetServicesArgs{Generation: 3, Chunk: 1, Final: true, Services: []ServicePort{
			{Protocol: "TCP", IP: "10.43.0.10", Port: 80, Endpoints: []Endpoint{{IP: "100.64.0.5", Port: 8080}}},
			{Protocol: "UDP", IP: "10.43.0.10", Port: 53},
		}}},
		{Version: Version, Verb: VerbSetServices, SetServices: &SetServicesArgs{Generation: 4, Final: true}},
	} {
		var buf bytes.Buffer
		if err := WriteRequest(&buf, r); err != nil {
			t.Fatal(err)
		}
		got, err := ReadRequest(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("got %+v, want %+v", got, r)
		}
	}
	resp := &Response{Version: Version, Pods: []PodResult{{UID: uid, IP: "100.64.0.2", PrefixLen: 24}}}
	var buf bytes.Buffer
	if err := WriteResponse(&buf, resp); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadResponse(&buf); err != nil || !reflect.DeepEqual(got, resp) {
		t.Fatalf("%+v %v", got, err)
	}
}

func TestReadRequestRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		data []byte
		want error
		msg  string
	}{
		"unknown field":    {frame(`{"version":1,"verb":"ListPods","extra":1}`), ErrMalformed, "unknown field"},
		"trailing data":    {frame(`{"version":1,"verb":"ListPods"}{}`), ErrMalformed, "trailing"},
		"not json":         {frame(`hello`), ErrMalformed, "invalid"},
		"empty body":       {frame(``), ErrMalformed, "EOF"},
		"null":             {frame(`null`), ErrMalformed, "version"},
		"old version":      {frame(`{"version":0,"verb":"ListPods"}`), ErrMalformed, "version: got 0"},
		"unknown verb":     {frame(`{"version":1,"verb":"Exec"}`), ErrMalformed, `"Exec" is not one of`},
		"missing args":     {frame(`{"version":1,"verb":"SetupPod"}`), ErrMalformed, "setupPod"},
		"wrong args":       {frame(`{"version":1,"verb":"SetupPod","teardownPod":{"uid":"ab"}}`), ErrMalformed, "setupPod"},
		"two args":         {frame(`{"version":1,"verb":"TeardownPod","teardownPod":{"uid":"ab"},"configure":{"podCIDR":"10.0.0.0/24"}}`), ErrMalformed, "no others"},
		"args on ListPods": {frame(`{"version":1,"verb":"ListPods","teardownPod":{"uid":"ab"}}`), ErrMalformed, "no arguments"},
		"oversized":        {binary.BigEndian.AppendUint32(nil, MaxFrame+1), ErrFrameTooLarge, "limit"},
		"huge length":      {[]byte{0xff, 0xff, 0xff, 0xff}, ErrFrameTooLarge, "limit"},
		"truncated body":   {frame(`{"version":1}`)[:8], io.ErrUnexpectedEOF, "unexpected EOF"},
		"truncated header": {[]byte{0, 0}, io.ErrUnexpectedEOF, "unexpected EOF"},
	} {
		_, err := ReadRequest(bytes.NewReader(tc.data))
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: got %v, want %v containing %q", name, err, tc.want, tc.msg)
		}
	}
	if _, err := ReadRequest(bytes.NewReader(nil)); err != io.EOF {
		t.Errorf("no data: got %v, want io.EOF (a clean end between frames)", err)
	}
}

func TestValidateFields(t *testing.T) {
	setup := func(uid, ns, name string) *Request {
		return &Request{Version: Version, Verb: VerbSetupPod, SetupPod: &SetupPodArgs{UID: uid, Namespace: ns, Name: name}}
	}
	long := strings.Repeat("a", 64)
	for _, tc := range []struct {
		r   *Request
		bad string // the field the error names; "" when valid
	}{
		{setup(uid, "default", "web-0"), ""},
		{setup(long, long[:63], strings.Repeat("a.", 126)+"a"), ""},
		{setup(long+"a", "default", "p"), "uid"},
		{setup("0B7A", "default", "p"), "uid"},
		{setup("-abc", "default", "p"), "uid"},
		{setup("../../etc", "default", "p"), "uid"},
		{setup("", "default", "p"), "uid"},
		{setup(uid, "Default", "p"), "namespace"},
		{setup(uid, long, "p"), "namespace"},
		{setup(uid, "a.b", "p"), "namespace"},
		{setup(uid, "", "p"), "namespace"},
		{setup(uid, "ns", "p-"), "name"},
		{setup(uid, "ns", "a..b"), "name"},
		{setup(uid, "ns", strings.Repeat("a", 254)), "name"},
		{setup(uid, "ns", "a b"), "name"},
		{setup(uid, "ns", "a\n"), "name"},
		{fromPid(setup(uid, "ns", "p"), -1), "fromPid"},
		{fromPid(setup(uid, "ns", "p"), 1<<30), "fromPid"},
		{fromPid(setup(uid, "ns", "p"), 4242), ""},
	} {
		err := tc.r.Validate()
		if tc.bad == "" && err != nil {
			t.Errorf("%+v: %v", tc.r.SetupPod, err)
		}
		if tc.bad != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.bad+":")) {
			t.Errorf("%+v: got %v, want an error naming %s", tc.r.SetupPod, err, tc.bad)
		}
	}
}

func TestParsePodCIDR(t *testing.T) {
	for s, want := range map[string]string{
		"100.64.0.0/24":       "",
		"10.42.0.0/16":        "",
		"10.42.1.16/28":       "",
		"10.42.0.0/15":        "/16 to /28",
		"10.42.0.0/29":        "/16 to /28",
		"10.42.0.1/24":        "host bits set (did you mean 10.42.0.0/24?)",
		"fd00::/64":           "not IPv4",
		"::ffff:10.0.0.0/120": "not IPv4",
		"127.0.0.0/16":        "reserved 127.0.0.0/8",
		"0.0.0.0/16":          "reserved 0.0.0.0/8",
		"239.1.0.0/16":        "reserved 224.0.0.0/4",
		"10.42.0.0":           "not a CIDR",
		"":                    "not a CIDR",
		"010.42.0.0/24":       "not a CIDR",
	} {
		_, err := ParsePodCIDR(s)
		if want == "" && err != nil {
			t.Errorf("%q: %v", s, err)
		}
		if want != "" && (err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "podCIDR:")) {
			t.Errorf("%q: got %v, want %q", s, err, want)
		}
	}
}

func TestWriteRefusesInvalidAndOversized(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteRequest(&buf, &Request{Version: Version, Verb: "Nope"}); err == nil || buf.Len() != 0 {
		t.Fatalf("an invalid request was written: %v", err)
	}
	big := &Response{Version: Version, Error: strings.Repeat("x", MaxResponseFrame)}
	if err := WriteResponse(&buf, big); !errors.Is(err, ErrFrameTooLarge) || buf.Len() != 0 {
		t.Fatalf("got %v", err)
	}
}

func TestReadResponseRefusesOtherVersion(t *testing.T) {
	if _, err := ReadResponse(bytes.NewReader(frame(`{"version":2}`))); !errors.Is(err, ErrMalformed) {
		t.Fatalf("got %v", err)
	}
}

func TestValidatePolicy(t *testing.T) {
	set := func(d PolicyDirection) *Request {
		return &Request{Version: Version, Verb: VerbSetPolicy, SetPolicy: &SetPolicyArgs{UID: uid, Egress: d}}
	}
	rule := func(r PolicyRule) PolicyDirection { return PolicyDirection{Isolated: true, Rules: []PolicyRule{r}} }
	many := func(n int) []PolicyPeer {
		out := make([]PolicyPeer, n)
		for i := range out {
			out[i] = PolicyPeer{CIDR: "10.0.0.0/8"}
		}
		return out
	}
	for _, tc := range []struct {
		d   PolicyDirection
		bad string // in the error; "" when valid
	}{
		{PolicyDirection{}, ""},
		{PolicyDirection{Isolated: true}, ""},
		{rule(PolicyRule{Peers: []PolicyPeer{{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16", "10.2.3.4/32"}}}}), ""},
		{rule(PolicyRule{Ports: []PolicyPort{{Protocol: "SCTP"}, {Protocol: "UDP", Port: 1, EndPort: 65535}}}), ""},
		{PolicyDirection{Rules: []PolicyRule{{}}}, "rules without isolation"},
		{PolicyDirection{Isolated: true, Rules: []PolicyRule{}}, "empty list"},
		{rule(PolicyRule{Peers: []PolicyPeer{}}), "empty list"},
		{rule(PolicyRule{Peers: []PolicyPeer{{CIDR: "10.0.0.0/8", Except: []string{}}}}), "empty list"},
		{rule(PolicyRule{Peers: []PolicyPeer{{CIDR: "10.0.0.1/8"}}}), "host bits"},
		{rule(PolicyRule{Peers: []PolicyPeer{{CIDR: "fd00::/8"}}}), "not IPv4"},
		{rule(PolicyRule{Peers: []PolicyPeer{{CIDR: "10.0.0.0"}}}), "not a CIDR"},
		{rule(PolicyRule{Peers: []PolicyPeer{{CIDR: "10.0.0.0/16", Except: []string{"10.0.0.0/8"}}}}), "not inside"},
		{rule(PolicyRule{Peers: []PolicyPeer{{CIDR: "10.0.0.0/16", Except: []string{"10.1.0.0/24"}}}}), "not inside"},
		{rule(PolicyRule{Ports: []PolicyPort{{Protocol: "tcp", Port: 80}}}), "protocol"},
		{rule(PolicyRule{Ports: []PolicyPort{{Protocol: "TCP", EndPort: 80}}}), "port range"},
		{rule(PolicyRule{Ports: []PolicyPort{{Protocol: "TCP", Port: 81, EndPort: 80}}}), "port range"},
		{rule(PolicyRule{Peers: many(MaxPolicyPeers + 1)}), "peers"},
		{rule(PolicyRule{Ports: make([]PolicyPort, MaxPolicyPorts+1)}), "ports"},
		{PolicyDirection{Isolated: true, Rules: make([]PolicyRule, MaxPolicyRules+1)}, "rules"},
	} {
		err := set(tc.d).Validate()
		if tc.bad == "" && err != nil {
			t.Errorf("%+v: %v", tc.d, err)
		}
		if tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad) || !strings.HasPrefix(err.Error(), "egress")) {
			t.Errorf("%+v: got %v, want an error about %s", tc.d, err, tc.bad)
		}
	}
	bad := &Request{Version: Version, Verb: VerbSetPolicy, SetPolicy: &SetPolicyArgs{UID: "../x"}}
	if err := bad.Validate(); err == nil || !strings.HasPrefix(err.Error(), "uid:") {
		t.Errorf("bad uid: %v", err)
	}
}

func TestValidateServices(t *testing.T) {
	set := func(a SetServicesArgs) *Request {
		return &Request{Version: Version, Verb: VerbSetServices, SetServices: &a}
	}
	svc := func(s ServicePort) SetServicesArgs { return SetServicesArgs{Services: []ServicePort{s}} }
	ep := func(ip string, port uint16) []Endpoint { return []Endpoint{{IP: ip, Port: port}} }
	for _, tc := range []struct {
		a   SetServicesArgs
		bad string
	}{
		{SetServicesArgs{}, ""},
		{svc(ServicePort{Protocol: "TCP", IP: "10.43.0.1", Port: 443, Endpoints: ep("100.64.0.2", 6443)}), ""},
		{svc(ServicePort{Protocol: "UDP", IP: "10.43.0.10", Port: 53}), ""},
		{SetServicesArgs{Chunk: -1}, "chunk"},
		{SetServicesArgs{Chunk: MaxServiceChunks}, "chunk"},
		{SetServicesArgs{Services: []ServicePort{}}, "empty list"},
		{svc(ServicePort{Protocol: "SCTP", IP: "10.43.0.1", Port: 1}), "protocol"},
		{svc(ServicePort{Protocol: "tcp", IP: "10.43.0.1", Port: 1}), "protocol"},
		{svc(ServicePort{Protocol: "TCP", IP: "10.43.0.1"}), "port 0"},
		{svc(ServicePort{Protocol: "TCP", IP: "fd00::1", Port: 1}), "not IPv4"},
		{svc(ServicePort{Protocol: "TCP", IP: "10.43.0.1/32", Port: 1}), "not an IP"},
		{svc(ServicePort{Protocol: "TCP", IP: "::ffff:10.43.0.1", Port: 1}), "not IPv4"},
		{svc(ServicePort{Protocol: "TCP", IP: "127.0.0.1", Port: 1}), "reserved"},
		{svc(ServicePort{Protocol: "TCP", IP: "10.43.0.1", Port: 1, Endpoints: []Endpoint{}}), "empty list"},
		{svc(ServicePort{Protocol: "TCP", IP: "10.43.0.1", Port: 1, Endpoints: ep("224.0.0.1", 1)}), "reserved"},
		{svc(ServicePort{Protocol: "TCP", IP: "10.43.0.1", Port: 1, Endpoints: ep("100.64.0.2", 0)}), "port 0"},
		{svc(ServicePort{Protocol: "TCP", IP: "10.43.0.1", Port: 1, Endpoints: append(ep("100.64.0.2", 1), ep("100.64.0.2", 1)...)}), "twice"},
		{SetServicesArgs{Services: []ServicePort{{Protocol: "TCP", IP: "10.43.0.1", Port: 1}, {Protocol: "TCP", IP: "10.43.0.1", Port: 1}}}, "twice"},
		{svc(ServicePort{Protocol: "TCP", IP: "10.43.0.1", Port: 1, Endpoints: make([]Endpoint, MaxServiceEndpoints+1)}), "endpoints"},
		// externalIPs: any unicast address but link-local and class E.
		{svc(ServicePort{Protocol: "TCP", IP: "203.0.113.10", Port: 80, External: true, Endpoints: ep("100.64.0.2", 8080)}), ""},
		{svc(ServicePort{Protocol: "TCP", IP: "169.254.169.254", Port: 80, External: true}), "reserved 169.254.0.0/16"},
		{svc(ServicePort{Protocol: "TCP", IP: "255.255.255.255", Port: 80, External: true}), "reserved 240.0.0.0/4"},
		{svc(ServicePort{Protocol: "TCP", IP: "127.0.0.1", Port: 80, External: true}), "reserved 127.0.0.0/8"},
		{svc(ServicePort{Protocol: "TCP", IP: "224.0.0.1", Port: 80, External: true}), "reserved 224.0.0.0/4"},
		{svc(ServicePort{Protocol: "TCP", IP: "0.0.0.0", Port: 80, External: true}), "reserved 0.0.0.0/8"},
		// Node addresses: a nodePort within 30000-32767, a load-balancer
		// port any; the same reserved ranges as externalIPs; one kind.
		{svc(ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 30000, NodePort: true, Local: true, Endpoints: ep("100.64.0.2", 8080)}), ""},
		{svc(ServicePort{Protocol: "UDP", IP: "192.168.1.5", Port: 32767, NodePort: true}), ""},
		{svc(ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 29999, NodePort: true}), "node port 29999 is outside the node port range 30000-32767"},
		{svc(ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 32768, NodePort: true}), "outside the node port range"},
		{svc(ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 80, NodePort: true}), "outside the node port range"},
		{svc(ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 443, LoadBalancer: true, Local: true}), ""},
		{svc(ServicePort{Protocol: "TCP", IP: "169.254.0.1", Port: 30000, NodePort: true}), "reserved 169.254.0.0/16"},
		{svc(ServicePort{Protocol: "TCP", IP: "127.0.0.1", Port: 30000, NodePort: true}), "reserved 127.0.0.0/8"},
		{svc(ServicePort{Protocol: "TCP", IP: "240.0.0.1", Port: 443, LoadBalancer: true}), "reserved 240.0.0.0/4"},
		{svc(ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 30000, NodePort: true, LoadBalancer: true}), "at most one of"},
		{svc(ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 30000, NodePort: true, External: true}), "at most one of"},
		{svc(ServicePort{Protocol: "TCP", IP: "10.43.0.1", Port: 80, Local: true}), "local (externalTrafficPolicy: Local) applies only to"},
	} {
		err := set(tc.a).Validate()
		if tc.bad == "" && err != nil {
			t.Errorf("%+v: %v", tc.a, err)
		}
		if tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad) || !strings.HasPrefix(err.Error(), "setServices")) {
			t.Errorf("%+v: got %v, want an error about %s", tc.a, err, tc.bad)
		}
	}
	if err := (&Request{Version: Version, Verb: VerbSetServices}).Validate(); err == nil {
		t.Error("SetServices without arguments accepted")
	}
}

// CheckServiceRange: a ClusterIP inside the Service range, an external IP
// anywhere but the pod and cluster ranges; an address outside the Service
// range that is not marked external is refused, naming the field.
func TestCheckServiceRange(t *testing.T) {
	pod, svc, cluster := netip.MustParsePrefix("100.64.0.0/24"), netip.MustParsePrefix("10.43.0.0/16"), netip.MustParsePrefix("100.64.0.0/10")
	for _, tc := range []struct {
		ip       string
		external bool
		bad      string
	}{
		{"10.43.0.10", false, ""},
		{"10.43.0.10", true, ""},
		{"203.0.113.10", true, ""},
		{"192.168.1.5", true, ""},
		{"203.0.113.10", false, `outside the serviceCIDR 10.43.0.0/16; only an address of spec.externalIPs may be, sent with "external": true`},
		{"100.64.0.7", true, "inside the podCIDR 100.64.0.0/24"},
		{"100.64.9.7", true, "inside the clusterCIDR 100.64.0.0/10"},
	} {
		sp := ServicePort{Protocol: "TCP", IP: tc.ip, Port: 80, External: tc.external}
		err := CheckServiceRange(sp, netip.MustParseAddr(tc.ip), pod, svc, cluster)
		if tc.bad == "" && err != nil {
			t.Errorf("%+v: %v", sp, err)
		}
		if tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad) || !strings.HasPrefix(err.Error(), "setServices: service TCP "+tc.ip+":80: ip ")) {
			t.Errorf("%+v: got %v, want an error about %s", sp, err, tc.bad)
		}
	}
	// Node addresses may lie outside the Service range, not inside the pod
	// ranges; a Local port's endpoints are all this node's pods.
	for _, tc := range []struct {
		sp  ServicePort
		bad string
	}{
		{ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 30080, NodePort: true, Local: true, Endpoints: []Endpoint{{IP: "100.64.0.9", Port: 8080}}}, ""},
		{ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 443, LoadBalancer: true}, ""},
		{ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 30080, NodePort: true, Endpoints: []Endpoint{{IP: "100.64.5.9", Port: 8080}}}, ""},
		{ServicePort{Protocol: "TCP", IP: "100.64.0.7", Port: 30080, NodePort: true}, "inside the podCIDR"},
		{ServicePort{Protocol: "TCP", IP: "192.168.1.5", Port: 30080, NodePort: true, Local: true, Endpoints: []Endpoint{{IP: "100.64.0.9", Port: 8080}, {IP: "100.64.5.9", Port: 8080}}}, "endpoint 100.64.5.9 is outside the podCIDR 100.64.0.0/24"},
		{ServicePort{Protocol: "TCP", IP: "203.0.113.10", Port: 80, External: true, Local: true, Endpoints: []Endpoint{{IP: "10.1.2.3", Port: 8080}}}, "outside the podCIDR"},
	} {
		err := CheckServiceRange(tc.sp, netip.MustParseAddr(tc.sp.IP), pod, svc, cluster)
		if tc.bad == "" && err != nil {
			t.Errorf("%+v: %v", tc.sp, err)
		}
		if tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)) {
			t.Errorf("%+v: got %v, want an error about %s", tc.sp, err, tc.bad)
		}
	}
	// A node without a Service range (darwin-style Configure) takes any
	// address outside the pod ranges.
	if err := CheckServiceRange(ServicePort{Protocol: "TCP", IP: "10.99.0.1", Port: 80}, netip.MustParseAddr("10.99.0.1"), pod, netip.Prefix{}, netip.Prefix{}); err != nil {
		t.Error(err)
	}
}

// One Service port with the most endpoints, every address and port at
// its longest, still fits in one frame: a chunk of one always can be sent.
func TestLargestServiceFitsAFrame(t *testing.T) {
	eps := make([]Endpoint, MaxServiceEndpoints)
	for i := range eps {
		eps[i] = Endpoint{IP: fmt.Sprintf("100.%d.%d.%d", 100+i/100%100, 100+i/10%10, 100+i%10), Port: 65535}
	}
	r := &Request{Version: Version, Verb: VerbSetServices, SetServices: &SetServicesArgs{Generation: ^uint64(0), Chunk: MaxServiceChunks - 1, Final: true,
		Services: []ServicePort{{Protocol: "TCP", IP: "100.100.100.100", Port: 65535, LoadBalancer: true, Local: true, Endpoints: eps}}}}
	var buf bytes.Buffer
	if err := WriteRequest(&buf, r); err != nil {
		t.Fatalf("%v (%d bytes)", err, buf.Len())
	}
}

func fromPid(r *Request, pid int) *Request {
	r.SetupPod.FromPid = pid
	return r
}
