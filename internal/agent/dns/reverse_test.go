package dns

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// With the Service and pod ranges owned, their reverse names are answered
// here (PTR, or NXDOMAIN/NODATA with the range's SOA) and never forwarded;
// a pod of this node that backs no Service gets its pod record name.
func TestReverse(t *testing.T) {
	pods := map[netip.Addr]string{netip.MustParseAddr("10.42.3.4"): "kube-system", netip.MustParseAddr("fd00:42::4"): "ops"}
	f := start(t, Config{
		ReverseRanges: []netip.Prefix{netip.MustParsePrefix("10.43.0.0/16"), netip.MustParsePrefix("10.42.0.0/15"), netip.MustParsePrefix("fd00:42::/64")},
		PodNamespace: func(ip netip.Addr) (string, bool) {
			ns, ok := pods[ip]
			return ns, ok
		},
	}, cluster()...)
	rev := func(ip string) string {
		n, err := dns.ReverseAddr(ip)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		name   string
		qtype  uint16
		rcode  int
		answer []string
		soa    string // owner of the SOA in authority, for negative answers
		fwd    bool   // forwarded: the upstream answers
	}{
		{name: rev("10.43.0.20"), qtype: dns.TypePTR, answer: []string{"web.default.svc.cluster.local."}},
		{name: rev("10.42.0.8"), qtype: dns.TypePTR, answer: []string{"10-42-0-8.web.default.svc.cluster.local."}},
		{name: rev("10.42.0.5"), qtype: dns.TypePTR, answer: []string{"db-0.db.data.svc.cluster.local."}},
		{name: strings.ToUpper(rev("10.42.0.5")), qtype: dns.TypePTR, answer: []string{"db-0.db.data.svc.cluster.local."}},
		// This node's pod that backs no Service: its pod record.
		{name: rev("10.42.3.4"), qtype: dns.TypePTR, answer: []string{"10-42-3-4.kube-system.pod.cluster.local."}},
		{name: rev("fd00:42::4"), qtype: dns.TypePTR, answer: []string{"fd00-42--4.ops.pod.cluster.local."}},
		// Unknown addresses in the ranges: NXDOMAIN from here.
		{name: rev("10.42.3.5"), qtype: dns.TypePTR, rcode: dns.RcodeNameError, soa: "42.10.in-addr.arpa."},
		{name: rev("10.43.200.1"), qtype: dns.TypePTR, rcode: dns.RcodeNameError, soa: "43.10.in-addr.arpa."},
		{name: rev("10.42.0.9"), qtype: dns.TypePTR, rcode: dns.RcodeNameError, soa: "42.10.in-addr.arpa."}, // not ready
		{name: rev("fd00:42::5"), qtype: dns.TypePTR, rcode: dns.RcodeNameError, soa: "0.0.0.0.0.0.0.0.2.4.0.0.0.0.d.f.ip6.arpa."},
		// The /15 is owned from its first octet-aligned name down.
		{name: rev("10.43.0.20"), qtype: dns.TypeA, soa: "43.10.in-addr.arpa."},         // NODATA: only a PTR there
		{name: "3.42.10.in-addr.arpa.", qtype: dns.TypePTR, soa: "42.10.in-addr.arpa."}, // empty non-terminal
		// Outside the ranges, or wider than one: upstream.
		{name: "10.in-addr.arpa.", qtype: dns.TypePTR, answer: []string{"from.upstream."}, fwd: true},
		{name: rev("192.0.2.9"), qtype: dns.TypePTR, answer: []string{"from.upstream."}, fwd: true},
		{name: rev("10.44.0.1"), qtype: dns.TypePTR, answer: []string{"from.upstream."}, fwd: true},
		{name: "x.0.42.10.in-addr.arpa.", qtype: dns.TypePTR, answer: []string{"from.upstream."}, fwd: true}, // not an address
	} {
		t.Run(tc.name+"/"+dns.TypeToString[tc.qtype], func(t *testing.T) {
			m := f.query(t, tc.name, tc.qtype)
			if m.Rcode != tc.rcode {
				t.Fatalf("rcode %s, want %s\n%v", dns.RcodeToString[m.Rcode], dns.RcodeToString[tc.rcode], m)
			}
			if m.Authoritative == tc.fwd {
				t.Errorf("authoritative %v, want %v (forwarded: %v)\n%v", m.Authoritative, !tc.fwd, tc.fwd, m)
			}
			var got []string
			for _, rr := range m.Answer {
				p, ok := rr.(*dns.PTR)
				if !ok || p.Hdr.Name != tc.name {
					t.Fatalf("answer %v is no PTR of %s", rr, tc.name)
				}
				got = append(got, p.Ptr)
			}
			if !slices.Equal(got, tc.answer) {
				t.Errorf("PTR %q, want %q", got, tc.answer)
			}
			if tc.soa != "" {
				if len(m.Ns) != 1 || m.Ns[0].Header().Rrtype != dns.TypeSOA || m.Ns[0].Header().Name != tc.soa {
					t.Errorf("authority %v, want the SOA of %s", m.Ns, tc.soa)
				}
			}
		})
	}
}

// A ClusterIP's PTR names the Service alone, even when the same address is
// also listed as an endpoint (a selector-less Service's own slice).
func TestReverseClusterIPFirst(t *testing.T) {
	objs := cluster()
	objs = append(objs, slice("default", "web", "web-odd", nil, ep{"10.43.0.20", "", true}))
	f := start(t, Config{}, objs...)
	m := f.query(t, "20.0.43.10.in-addr.arpa.", dns.TypePTR)
	if got := texts(m.Answer); !slices.Equal(got, []string{"20.0.43.10.in-addr.arpa. 5 IN PTR web.default.svc.cluster.local."}) {
		t.Errorf("PTR %q", got)
	}
}

func TestParseReverse(t *testing.T) {
	for _, tc := range []struct {
		name string
		ip   string
		bits int
		ok   bool
	}{
		{"4.3.2.1.in-addr.arpa.", "1.2.3.4", 32, true},
		{"2.1.in-addr.arpa.", "1.2.0.0", 16, true},
		{"in-addr.arpa.", "0.0.0.0", 0, true},
		{"04.3.2.1.in-addr.arpa.", "", 0, false},  // not canonical
		{"256.3.2.1.in-addr.arpa.", "", 0, false}, // not an octet
		{"5.4.3.2.1.in-addr.arpa.", "", 0, false}, // too long
		{"xin-addr.arpa.", "", 0, false},
		{"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.2.4.0.0.0.0.d.f.ip6.arpa.", "fd00:42::1", 128, true},
		{"d.f.ip6.arpa.", "fd00::", 8, true},
		{"dd.f.ip6.arpa.", "", 0, false},
		{"example.com.", "", 0, false},
	} {
		ip, bits, ok := parseReverse(tc.name)
		if ok != tc.ok || ok && (ip.String() != tc.ip || bits != tc.bits) {
			t.Errorf("parseReverse(%q) = %v %d %v, want %s %d %v", tc.name, ip, bits, ok, tc.ip, tc.bits, tc.ok)
		}
	}
	for _, p := range []string{"10.43.0.0/16", "10.0.0.0/8", "fd00:42::/64", "fd00:42::/60"} {
		pp := netip.MustParsePrefix(p)
		ip, bits, ok := parseReverse(reverseName(pp))
		if !ok || netip.PrefixFrom(ip, bits) != pp {
			t.Errorf("reverseName(%s) = %s reads back as %v/%d", p, reverseName(pp), ip, bits)
		}
	}
}
