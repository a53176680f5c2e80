package main

import (
	"net"
	"testing"

	"github.com/miekg/dns"
)

func TestCheck(t *testing.T) {
	q := new(dns.Msg)
	q.SetQuestion("svc-7.default.svc.cluster.local.", dns.TypeA)
	m := new(dns.Msg)
	m.SetReply(q)
	m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.IPv4(10, 43, 0, 8)}}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if !check(b, []byte{10, 43, 0, 8}) || !check(b, nil) {
		t.Error("a right answer is refused")
	}
	if check(b, []byte{10, 43, 0, 9}) {
		t.Error("a wrong address is accepted")
	}
	m.Rcode = dns.RcodeNameError
	b, _ = m.Pack()
	if check(b, nil) {
		t.Error("NXDOMAIN accepted")
	}
}

func TestFixture(t *testing.T) {
	objs, ipOf := fixture(100)
	if len(ipOf) != 90 || ipOf["svc-7.default.svc.cluster.local."] != "10.43.0.8" || len(objs) != 110 {
		t.Errorf("%d objects, %d ClusterIP names, svc-7 at %q", len(objs), len(ipOf), ipOf["svc-7.default.svc.cluster.local."])
	}
}

func TestMedian(t *testing.T) {
	if median([]float64{3, 1, 2}) != 2 || median([]float64{4, 1, 2, 3}) != 2.5 {
		t.Error("median")
	}
}
