package dns

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// index is one immutable snapshot of the cluster's records. Queries read it
// without locks; a change builds a new one. RRs in it are shared by every
// answer, so answers copy slices (append to nil) and never modify an RR.
type index struct {
	zone  string           // "cluster.local."
	names map[string]*node // lowercase FQDN inside the zone
	ptr   map[string][]dns.RR
	soa   *dns.SOA
}

// node is one name in the zone. A node without records is an empty
// non-terminal (e.g. "svc.cluster.local."): it exists, so queries for it get
// NODATA rather than NXDOMAIN.
type node struct {
	a, aaaa, srv, txt []dns.RR
	extra             []dns.RR // additional section of SRV answers: the targets' addresses
	cname             *dns.CNAME
}

type builder struct {
	ix   *index
	seen map[string]struct{} // RRs already added, by their text form
	// epPTR are the PTRs of endpoint addresses: merged into ix.ptr at the
	// end, except for addresses that are a ClusterIP, whose PTR names only
	// the Service (as in CoreDNS).
	epPTR map[string][]dns.RR
}

func hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: TTL}
}

// buildIndex builds the records of the specification's schema 1.1.0 from
// Services and their EndpointSlices.
func buildIndex(zone string, svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice) *index {
	b := &builder{
		ix: &index{
			zone:  zone,
			names: make(map[string]*node, 2*len(svcs)+8),
			ptr:   make(map[string][]dns.RR, len(svcs)),
			soa: &dns.SOA{
				Hdr:     hdr(zone, dns.TypeSOA),
				Ns:      "ns.dns." + zone,
				Mbox:    "hostmaster." + zone,
				Serial:  uint32(time.Now().Unix()),
				Refresh: 7200, Retry: 1800, Expire: 86400,
				Minttl: TTL, // negative answers are cached as briefly as positive ones
			},
		},
		seen:  map[string]struct{}{},
		epPTR: map[string][]dns.RR{},
	}
	b.node(zone)
	b.node("svc." + zone)
	b.node("pod." + zone)
	ver := "dns-version." + zone
	b.node(ver).txt = []dns.RR{&dns.TXT{Hdr: hdr(ver, dns.TypeTXT), Txt: []string{SchemaVersion}}}

	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range eps {
		if name := s.Labels[discoveryv1.LabelServiceName]; name != "" {
			k := s.Namespace + "/" + name
			bySvc[k] = append(bySvc[k], s)
		}
	}
	// Sorted input gives the same index, and the same answer order, for the
	// same cluster state.
	svcs = slices.Clone(svcs)
	slices.SortFunc(svcs, func(a, b *corev1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, svc := range svcs {
		sl := bySvc[svc.Namespace+"/"+svc.Name]
		slices.SortFunc(sl, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
		b.service(svc, sl)
	}
	b.finish()
	return b.ix
}

// node returns the node of name, creating it and its ancestors below the
// zone apex (the empty non-terminals).
func (b *builder) node(name string) *node {
	if n, ok := b.ix.names[name]; ok {
		return n
	}
	n := &node{}
	b.ix.names[name] = n
	if name != b.ix.zone {
		if _, parent, ok := strings.Cut(name, "."); ok && strings.HasSuffix(parent, b.ix.zone) {
			b.node(parent)
		}
	}
	return n
}

// once reports whether rr (with the name it belongs to) was not added yet:
// an address can be in two slices of a Service while endpoints move.
func (b *builder) once(where string, rr dns.RR) bool {
	k := where + " " + rr.String()
	if _, ok := b.seen[k]; ok {
		return false
	}
	b.seen[k] = struct{}{}
	return true
}

// addr adds the A or AAAA record ip to name.
func (b *builder) addr(name string, ip netip.Addr) dns.RR {
	n := b.node(name)
	var rr dns.RR
	if ip.Is4() {
		rr = &dns.A{Hdr: hdr(name, dns.TypeA), A: ip.AsSlice()}
	} else {
		rr = &dns.AAAA{Hdr: hdr(name, dns.TypeAAAA), AAAA: ip.AsSlice()}
	}
	if b.once("", rr) {
		if ip.Is4() {
			n.a = append(n.a, rr)
		} else {
			n.aaaa = append(n.aaaa, rr)
		}
	}
	return rr
}

// ptr adds a PTR from ip to target: to the Service PTRs (ix.ptr), or to
// the endpoint PTRs (epPTR) when endpoint is set.
func (b *builder) ptr(ip netip.Addr, target string, endpoint bool) {
	rev, err := dns.ReverseAddr(ip.String())
	if err != nil {
		return
	}
	rr := &dns.PTR{Hdr: hdr(rev, dns.TypePTR), Ptr: target}
	if !b.once("", rr) {
		return
	}
	if endpoint {
		b.epPTR[rev] = append(b.epPTR[rev], rr)
	} else {
		b.ix.ptr[rev] = append(b.ix.ptr[rev], rr)
	}
}

func (b *builder) srv(name string, port int32, target string, targetAddrs []dns.RR) {
	rr := &dns.SRV{Hdr: hdr(name, dns.TypeSRV), Port: uint16(port), Target: target}
	if !b.once("", rr) {
		return
	}
	n := b.node(name)
	n.srv = append(n.srv, rr)
	for _, a := range targetAddrs {
		if b.once(name, a) {
			n.extra = append(n.extra, a)
		}
	}
}

func srvName(port, proto, svcName string) string {
	return "_" + strings.ToLower(port) + "._" + strings.ToLower(proto) + "." + svcName
}

func (b *builder) service(svc *corev1.Service, eps []*discoveryv1.EndpointSlice) {
	name := strings.ToLower(svc.Name + "." + svc.Namespace + ".svc." + b.ix.zone)
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		n := b.node(name)
		target := strings.ToLower(dns.Fqdn(svc.Spec.ExternalName))
		// An IP in externalName is not a name to alias; the Service then
		// exists without records (NODATA), as the API allows it but DNS can't.
		if _, err := netip.ParseAddr(svc.Spec.ExternalName); err == nil || !dnsName(target) || target == "." {
			return
		}
		n.cname = &dns.CNAME{Hdr: hdr(name, dns.TypeCNAME), Target: target}

	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		b.endpoints(name, eps, true)

	case svc.Spec.ClusterIP != "":
		ips := svc.Spec.ClusterIPs
		if len(ips) == 0 {
			ips = []string{svc.Spec.ClusterIP}
		}
		var addrs []dns.RR
		for _, s := range ips {
			ip, err := netip.ParseAddr(s)
			if err != nil {
				continue
			}
			addrs = append(addrs, b.addr(name, ip))
			b.ptr(ip, name, false)
		}
		if len(addrs) == 0 {
			return
		}
		for _, p := range svc.Spec.Ports {
			if p.Name != "" {
				b.srv(srvName(p.Name, string(p.Protocol), name), p.Port, name, addrs)
			}
		}
		b.endpoints(name, eps, false)
	}
}

// endpoints adds, for every ready endpoint address of a Service: an A/AAAA
// record on <hostname>.<service> (the endpoint's hostname, or the address
// with dashes when it has none) and a PTR from the address to that name, as
// CoreDNS does for every Service (so a pod's address that backs a Service
// resolves back to a name that resolves forward). For a headless Service
// also an A/AAAA record on the Service name and an SRV per named port. A
// headless Service without ready endpoints gets no node at all: NXDOMAIN, as
// in CoreDNS (the specification asks for NXDOMAIN then, too).
func (b *builder) endpoints(name string, eps []*discoveryv1.EndpointSlice, headless bool) {
	for _, s := range eps {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		for _, ep := range s.Endpoints {
			// Ready nil means unknown, to be read as ready (API docs). The
			// EndpointSlice controller already marks every address ready
			// for Services that publishNotReadyAddresses.
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				host := ""
				if ep.Hostname != nil {
					host = strings.ToLower(*ep.Hostname)
				}
				if host == "" || !dnsName(host+".") {
					host = dashed(ip)
				}
				hostName := host + "." + name
				hostAddr := b.addr(hostName, ip)
				b.ptr(ip, hostName, true)
				if !headless {
					continue
				}
				b.addr(name, ip)
				for _, p := range s.Ports {
					if p.Name == nil || *p.Name == "" || p.Port == nil {
						continue
					}
					proto := string(corev1.ProtocolTCP)
					if p.Protocol != nil {
						proto = string(*p.Protocol)
					}
					b.srv(srvName(*p.Name, proto, name), *p.Port, hostName, []dns.RR{hostAddr})
				}
			}
		}
	}
}

// dashed is an address as one DNS label: 10.1.2.3 → 10-1-2-3, fd00::1 →
// fd00--1, the form pod records use too.
func dashed(ip netip.Addr) string {
	if ip.Is4() {
		return strings.ReplaceAll(ip.String(), ".", "-")
	}
	return strings.ReplaceAll(ip.String(), ":", "-")
}

// finish merges the endpoint PTRs, orders addresses and gives each SRV set
// equal weights.
func (b *builder) finish() {
	for rev, rrs := range b.epPTR {
		if _, svc := b.ix.ptr[rev]; !svc {
			b.ix.ptr[rev] = rrs
		}
	}
	for _, n := range b.ix.names {
		byText := func(x, y dns.RR) int { return cmp.Compare(x.String(), y.String()) }
		slices.SortFunc(n.a, byText)
		slices.SortFunc(n.aaaa, byText)
		slices.SortFunc(n.srv, byText)
		if len(n.srv) > 0 {
			w := uint16(max(100/len(n.srv), 1))
			for _, rr := range n.srv {
				rr.(*dns.SRV).Weight = w
			}
		}
	}
	b.seen = nil
}
