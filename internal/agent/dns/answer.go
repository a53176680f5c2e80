package dns

import (
	"context"
	"net"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
)

// maxChase bounds CNAME chains followed for one answer.
const maxChase = 8

// opt is the OPT record of every EDNS answer; shared, as packing only reads it.
var opt = func() *dns.OPT {
	o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
	o.SetUDPSize(ednsSize)
	return o
}()

// ServeDNS answers names in the cluster domain from the index and forwards
// the rest.
func (s *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	if r.Response || r.Opcode != dns.OpcodeQuery || len(r.Question) != 1 {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeNotImplemented)
		if len(r.Question) != 1 {
			m.Rcode = dns.RcodeFormatError
		}
		_ = w.WriteMsg(m)
		return
	}
	q := r.Question[0]
	lname := strings.ToLower(q.Name) // no copy when already lowercase
	ix := s.index.Load()

	if inZone(lname, s.zone) {
		m := reply(r)
		switch {
		case q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY:
			m.Rcode = dns.RcodeRefused
		case ix == nil:
			m.Rcode = dns.RcodeServerFailure // not synced yet: retry, don't cache
		default:
			m.Authoritative = true
			s.answer(m, ix, q.Name, lname, q.Qtype, 0)
		}
		respond(w, r, m)
		return
	}
	// Reverse names of Service and endpoint addresses are answered here;
	// the rest of the reverse space (node, pod, outside addresses) is not
	// ours and goes upstream.
	if ix != nil && (q.Qtype == dns.TypePTR || q.Qtype == dns.TypeANY) {
		if ptrs, ok := ix.ptr[lname]; ok {
			m := reply(r)
			m.Authoritative = true
			m.Answer = appendOwned(nil, ptrs, q.Name, lname)
			respond(w, r, m)
			return
		}
	}
	s.forwardQuery(w, r, lname)
}

// reply starts an answer to r: question copied, recursion available (the
// server recurses for everything outside the zone).
func reply(r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	return m
}

// respond sends an answer built here: with EDNS if r used it.
func respond(w dns.ResponseWriter, r *dns.Msg, m *dns.Msg) {
	if r.IsEdns0() != nil {
		m.Extra = append(m.Extra, opt)
	}
	write(w, r, m)
}

// write sends m, truncated to what a UDP client can take.
func write(w dns.ResponseWriter, r *dns.Msg, m *dns.Msg) {
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if o := r.IsEdns0(); o != nil {
			size = int(min(o.UDPSize(), ednsSize*4))
		}
		m.Truncate(size) // compresses only when the answer would not fit
	} else {
		m.Compress = true
	}
	_ = w.WriteMsg(m)
}

func inZone(lname, zone string) bool {
	return strings.HasSuffix(lname, zone) && (len(lname) == len(zone) || lname[len(lname)-len(zone)-1] == '.')
}

// appendOwned appends rrs for an answer to qname: the shared RRs as they
// are when the query was lowercase, else copies carrying the query's
// spelling (resolvers that randomize case check it: "DNS 0x20").
func appendOwned(dst, rrs []dns.RR, qname, lname string) []dns.RR {
	if qname == lname {
		return append(dst, rrs...)
	}
	for _, rr := range rrs {
		c := dns.Copy(rr)
		c.Header().Name = qname
		dst = append(dst, c)
	}
	return dst
}

// appendRotated is appendOwned starting at a different record each time, so
// clients that take the first address spread over a headless Service's
// endpoints.
func (s *Server) appendRotated(dst, rrs []dns.RR, qname, lname string) []dns.RR {
	if len(rrs) < 2 {
		return appendOwned(dst, rrs, qname, lname)
	}
	k := int(s.rr.Add(1) % uint32(len(rrs)))
	dst = appendOwned(dst, rrs[k:], qname, lname)
	return appendOwned(dst, rrs[:k], qname, lname)
}

// answer fills m for a name in the zone. depth counts followed CNAMEs.
func (s *Server) answer(m *dns.Msg, ix *index, qname, lname string, qtype uint16, depth int) {
	n, ok := ix.names[lname]
	if !ok {
		if rr, exists := podRecord(ix.zone, qname, lname, qtype); exists {
			if rr != nil {
				m.Answer = append(m.Answer, rr)
			} else {
				m.Ns = append(m.Ns, ix.soa)
			}
			return
		}
		m.Rcode = dns.RcodeNameError
		m.Ns = append(m.Ns, ix.soa)
		return
	}
	if n.cname != nil && qtype != dns.TypeCNAME {
		m.Answer = appendOwned(m.Answer, []dns.RR{n.cname}, qname, lname)
		s.chase(m, ix, n.cname.Target, qtype, depth)
		return
	}
	before := len(m.Answer)
	switch qtype {
	case dns.TypeA:
		m.Answer = s.appendRotated(m.Answer, n.a, qname, lname)
	case dns.TypeAAAA:
		m.Answer = s.appendRotated(m.Answer, n.aaaa, qname, lname)
	case dns.TypeSRV:
		m.Answer = appendOwned(m.Answer, n.srv, qname, lname)
		m.Extra = append(m.Extra, n.extra...)
	case dns.TypeTXT:
		m.Answer = appendOwned(m.Answer, n.txt, qname, lname)
	case dns.TypeCNAME:
		if n.cname != nil {
			m.Answer = appendOwned(m.Answer, []dns.RR{n.cname}, qname, lname)
		}
	case dns.TypeSOA:
		if lname == ix.zone {
			m.Answer = appendOwned(m.Answer, []dns.RR{ix.soa}, qname, lname)
		}
	case dns.TypeANY:
		for _, set := range [][]dns.RR{n.a, n.aaaa, n.srv, n.txt} {
			m.Answer = appendOwned(m.Answer, set, qname, lname)
		}
		if lname == ix.zone {
			m.Answer = appendOwned(m.Answer, []dns.RR{ix.soa}, qname, lname)
		}
	}
	if len(m.Answer) == before {
		m.Ns = append(m.Ns, ix.soa) // NODATA: the name exists, the type doesn't
	}
}

// chase follows a CNAME to target: inside the zone from the index, outside
// it through the forwarder, so stub resolvers (which do not chase) get the
// addresses of an ExternalName Service's target in one answer.
func (s *Server) chase(m *dns.Msg, ix *index, target string, qtype uint16, depth int) {
	if depth >= maxChase {
		return
	}
	if inZone(target, ix.zone) {
		s.answer(m, ix, target, target, qtype, depth+1)
		return
	}
	q := new(dns.Msg)
	q.SetQuestion(target, qtype)
	ctx, cancel := context.WithTimeout(context.Background(), upstreamTimeout)
	defer cancel()
	resp, err := s.fwd.exchange(ctx, q, target, false)
	if err != nil {
		s.log.Debug("dns: following CNAME", "target", target, "err", err)
		return
	}
	m.Answer = append(m.Answer, resp.Answer...)
	if resp.Rcode != dns.RcodeSuccess {
		m.Rcode = resp.Rcode // RFC 6604: the rcode of the last name in the chain
	}
}

// podRecord answers <a-b-c-d>.<ns>.pod.<zone> (and <ns>.pod.<zone>, an empty
// non-terminal) from the name alone. exists is false for names that are not
// pod records; rr is nil for NODATA.
func podRecord(zone, qname, lname string, qtype uint16) (rr dns.RR, exists bool) {
	rest, ok := strings.CutSuffix(lname, ".pod."+zone)
	if !ok || rest == "" {
		return nil, false
	}
	label, ns, ok := strings.Cut(rest, ".")
	if !ok {
		return nil, true // <ns>.pod.<zone>
	}
	if ns == "" || strings.Contains(ns, ".") {
		return nil, false
	}
	var ip netip.Addr
	var err error
	if strings.Count(label, "-") == 3 {
		ip, err = netip.ParseAddr(strings.ReplaceAll(label, "-", "."))
	} else {
		ip, err = netip.ParseAddr(strings.ReplaceAll(label, "-", ":"))
	}
	if err != nil || ip.Zone() != "" {
		return nil, false
	}
	switch {
	case ip.Is4() && (qtype == dns.TypeA || qtype == dns.TypeANY):
		return &dns.A{Hdr: hdr(qname, dns.TypeA), A: ip.AsSlice()}, true
	case ip.Is6() && (qtype == dns.TypeAAAA || qtype == dns.TypeANY):
		return &dns.AAAA{Hdr: hdr(qname, dns.TypeAAAA), AAAA: ip.AsSlice()}, true
	}
	return nil, true
}
