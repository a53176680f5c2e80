package dns

import (
	"context"
	"net"
	"net/netip"
	"strconv"
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
	if ix != nil {
		if m := s.reverse(r, ix, q, lname); m != nil {
			respond(w, r, m)
			return
		}
	}
	s.forwardQuery(w, r, lname)
}

// reverse answers a reverse name (in-addr.arpa, ip6.arpa) this server
// knows or owns, or returns nil to forward it. Known are the addresses of
// Services and of ready endpoints (the index's PTRs). Owned are the names in
// the Service and pod ranges (Config.ReverseRanges): never forwarded, since
// the host's resolvers cannot know them; a pod address there that backs no
// Service is answered for this node's own pods (Config.PodNamespace) and is
// NXDOMAIN otherwise.
func (s *Server) reverse(r *dns.Msg, ix *index, q dns.Question, lname string) *dns.Msg {
	ptrs, known := ix.ptr[lname]
	ip, bits, isRev := parseReverse(lname)
	owner := s.reverseOwner(ip, bits, isRev)
	if !known && owner == "" {
		return nil
	}
	full := isRev && bits == ip.BitLen()
	if !known && full && s.podNS != nil {
		if ns, ok := s.podNS(ip); ok && dnsName(ns+".") {
			known = true
			ptrs = []dns.RR{&dns.PTR{Hdr: hdr(lname, dns.TypePTR), Ptr: dashed(ip) + "." + strings.ToLower(ns) + ".pod." + ix.zone}}
		}
	}
	m := reply(r)
	m.Authoritative = true
	if owner == "" {
		owner = lname
	}
	switch {
	case known && (q.Qtype == dns.TypePTR || q.Qtype == dns.TypeANY):
		m.Answer = appendOwned(nil, ptrs, q.Name, lname)
	case known || !full:
		// NODATA: the name has a PTR only, or is an empty non-terminal of
		// an owned range (e.g. 0.43.10.in-addr.arpa).
		m.Ns = append(m.Ns, reverseSOA(ix, owner))
	default:
		m.Rcode = dns.RcodeNameError
		m.Ns = append(m.Ns, reverseSOA(ix, owner))
	}
	return m
}

// reverseOwner is the apex of the owned reverse zone that holds the name
// of ip's first bits: the range's reverse name, its prefix length rounded
// up to whole labels (octets, nibbles), so it is an ancestor of the query.
// "" when no range holds it.
func (s *Server) reverseOwner(ip netip.Addr, bits int, isRev bool) string {
	if !isRev {
		return ""
	}
	for _, p := range s.reverseRanges {
		if p.Addr().Is4() != ip.Is4() || bits < p.Bits() || !p.Contains(ip) {
			continue
		}
		step := 8
		if ip.Is6() {
			step = 4
		}
		return reverseName(netip.PrefixFrom(ip, (p.Bits()+step-1)/step*step).Masked())
	}
	return ""
}

// reverseSOA is the index's SOA, owned by a reverse zone apex.
func reverseSOA(ix *index, apex string) dns.RR {
	soa := *ix.soa
	soa.Hdr.Name = apex
	return &soa
}

// parseReverse reads a reverse name: the address its labels give (the rest
// zero) and how many bits they give. ok is false for any other name and
// for labels that are not one canonical octet (IPv4) or nibble (IPv6).
func parseReverse(lname string) (ip netip.Addr, bits int, ok bool) {
	if rest, found := strings.CutSuffix(lname, "in-addr.arpa."); found {
		var a [4]byte
		labels := strings.Split(strings.TrimSuffix(rest, "."), ".")
		if rest == "" {
			labels = nil
		} else if len(labels) > 4 || !strings.HasSuffix(rest, ".") {
			return ip, 0, false
		}
		for i, l := range labels {
			v, err := strconv.Atoi(l)
			if err != nil || v < 0 || v > 255 || strconv.Itoa(v) != l {
				return ip, 0, false
			}
			a[len(labels)-1-i] = byte(v)
		}
		return netip.AddrFrom4(a), 8 * len(labels), true
	}
	if rest, found := strings.CutSuffix(lname, "ip6.arpa."); found {
		var a [16]byte
		labels := strings.Split(strings.TrimSuffix(rest, "."), ".")
		if rest == "" {
			labels = nil
		} else if len(labels) > 32 || !strings.HasSuffix(rest, ".") {
			return ip, 0, false
		}
		for i, l := range labels {
			v, err := strconv.ParseUint(l, 16, 8)
			if err != nil || len(l) != 1 {
				return ip, 0, false
			}
			n := len(labels) - 1 - i // nibble index from the top
			if n%2 == 0 {
				a[n/2] |= byte(v) << 4
			} else {
				a[n/2] |= byte(v)
			}
		}
		return netip.AddrFrom16(a), 4 * len(labels), true
	}
	return ip, 0, false
}

// reverseName is the reverse name of a prefix whose length is a whole
// number of labels: 10.43.0.0/16 → 43.10.in-addr.arpa.
func reverseName(p netip.Prefix) string {
	var b strings.Builder
	if p.Addr().Is4() {
		a := p.Addr().As4()
		for i := p.Bits()/8 - 1; i >= 0; i-- {
			b.WriteString(strconv.Itoa(int(a[i])))
			b.WriteByte('.')
		}
		b.WriteString("in-addr.arpa.")
		return b.String()
	}
	a := p.Addr().As16()
	for n := p.Bits()/4 - 1; n >= 0; n-- {
		v := a[n/2] >> 4
		if n%2 == 1 {
			v = a[n/2] & 0xf
		}
		b.WriteString(strconv.FormatUint(uint64(v), 16))
		b.WriteByte('.')
	}
	b.WriteString("ip6.arpa.")
	return b.String()
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
