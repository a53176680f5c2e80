package dns

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// Every socket of these tests is on 127.0.0.0/8: the resolver on
// 127.0.0.70, fake upstreams on 127.0.0.71 and up.
const resolverIP = "127.0.0.70"

func service(ns, name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, Ports: ports},
	}
}

type ep struct {
	ip, host string
	ready    bool
}

func slice(ns, svc, name string, ports []discoveryv1.EndpointPort, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
	}
	for _, e := range eps {
		x := discoveryv1.Endpoint{Addresses: []string{e.ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(e.ready)}}
		if e.host != "" {
			x.Hostname = ptr.To(e.host)
		}
		s.Endpoints = append(s.Endpoints, x)
	}
	return s
}

// cluster is the fixture most tests query.
func cluster() []runtime.Object {
	web := service("default", "web", "10.43.0.20",
		corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
		corev1.ServicePort{Name: "DNS", Port: 53, Protocol: corev1.ProtocolUDP})
	db := service("data", "db", corev1.ClusterIPNone)
	empty := service("default", "empty", corev1.ClusterIPNone)
	ext := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "alias"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "web.default.svc.cluster.local"},
	}
	out := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "outside"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "www.upstream.test"},
	}
	pg := []discoveryv1.EndpointPort{{Name: ptr.To("pg"), Port: ptr.To[int32](5432), Protocol: ptr.To(corev1.ProtocolTCP)}}
	http := []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}
	return []runtime.Object{web, db, empty, ext, out,
		slice("default", "web", "web-a", http, ep{"10.42.0.8", "", true}, ep{"10.42.0.9", "", false}),
		slice("data", "db", "db-a", pg, ep{"10.42.0.5", "db-0", true}, ep{"10.42.0.7", "db-2", false}),
		slice("data", "db", "db-b", pg, ep{"10.42.0.6", "", true}),
	}
}

// upstream is a fake DNS server on ip: answers from answer, over UDP and
// TCP; it counts the queries it saw over TCP.
type upstream struct {
	addr string
	tcp  atomic.Int32
}

func startUpstream(t *testing.T, ip string, answer func(q dns.Question, tcp bool, m *dns.Msg)) *upstream {
	t.Helper()
	pc, l, err := listen(ip + ":0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: pc.LocalAddr().String()}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		_, tcp := w.RemoteAddr().(*net.TCPAddr)
		if tcp {
			u.tcp.Add(1)
		}
		m := new(dns.Msg)
		m.SetReply(r)
		answer(r.Question[0], tcp, m)
		_ = w.WriteMsg(m)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: l, Handler: h}} {
		go func() { _ = srv.ActivateAndServe() }()
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return u
}

func rr(t *testing.T, s string) dns.RR {
	t.Helper()
	r, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// defaultUpstream answers *.upstream.test and reverse names with fixed
// records; "big.upstream.test" is too big for UDP.
func defaultUpstream(t *testing.T) *upstream {
	return startUpstream(t, "127.0.0.71", func(q dns.Question, tcp bool, m *dns.Msg) {
		switch {
		case q.Name == "big.upstream.test." && !tcp:
			m.Truncated = true
		case q.Name == "big.upstream.test.":
			for i := range 60 {
				m.Answer = append(m.Answer, rr(t, fmt.Sprintf("big.upstream.test. 60 IN A 192.0.2.%d", i)))
			}
		case strings.HasSuffix(q.Name, ".in-addr.arpa.") && q.Qtype == dns.TypePTR:
			m.Answer = append(m.Answer, rr(t, q.Name+" 60 IN PTR from.upstream."))
		case strings.HasSuffix(q.Name, ".upstream.test.") && q.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, rr(t, q.Name+" 60 IN A 192.0.2.1"))
		default:
			m.Rcode = dns.RcodeNameError
		}
	})
}

type fixture struct {
	srv    *Server
	addr   string
	client *fake.Clientset
	up     *upstream
}

func start(t *testing.T, cfg Config, objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{client: fake.NewClientset(objs...)}
	if cfg.Upstreams == nil {
		f.up = defaultUpstream(t)
		cfg.Upstreams = []string{f.up.addr}
	}
	cfg.Client = f.client
	cfg.Domain = "cluster.local"
	cfg.Listen = []string{resolverIP + ":0"}
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-srv.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("resolver not ready after 10s")
	}
	f.srv, f.addr = srv, srv.Addrs()[0]
	return f
}

func (f *fixture) query(t *testing.T, name string, qtype uint16) *dns.Msg {
	t.Helper()
	return exchange(t, "udp", f.addr, name, qtype)
}

func exchange(t *testing.T, net, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	c := &dns.Client{Net: net, Timeout: 5 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s: %v", name, dns.TypeToString[qtype], err)
	}
	return r
}

// texts are the records of a section in presentation form.
func texts(rrs []dns.RR) []string {
	var out []string
	for _, r := range rrs {
		if _, ok := r.(*dns.OPT); !ok {
			out = append(out, strings.ReplaceAll(r.String(), "\t", " "))
		}
	}
	slices.Sort(out)
	return out
}

func TestRecords(t *testing.T) {
	f := start(t, Config{}, cluster()...)
	const z = "cluster.local."
	soa := func(m *dns.Msg) bool { return len(m.Ns) == 1 && m.Ns[0].Header().Rrtype == dns.TypeSOA }
	for _, tc := range []struct {
		name   string
		qtype  uint16
		rcode  int
		answer []string
		extra  []string
		nodata bool // NOERROR, empty answer, SOA in authority
	}{
		{name: "web.default.svc." + z, qtype: dns.TypeA,
			answer: []string{"web.default.svc.cluster.local. 5 IN A 10.43.0.20"}},
		{name: "WEB.Default.Svc.Cluster.LOCAL.", qtype: dns.TypeA, // the query's spelling is kept
			answer: []string{"WEB.Default.Svc.Cluster.LOCAL. 5 IN A 10.43.0.20"}},
		{name: "web.default.svc." + z, qtype: dns.TypeAAAA, nodata: true},
		{name: "web.default.svc." + z, qtype: dns.TypeMX, nodata: true},
		{name: "nope.default.svc." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError},
		{name: "web.nons.svc." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError},
		{name: "nothing." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError},
		{name: "svc." + z, qtype: dns.TypeA, nodata: true},         // empty non-terminal
		{name: "default.svc." + z, qtype: dns.TypeA, nodata: true}, // namespace with Services
		{name: z, qtype: dns.TypeSOA, answer: []string{"cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. SERIAL 7200 1800 86400 5"}},
		{name: z, qtype: dns.TypeA, nodata: true},
		{name: "dns-version." + z, qtype: dns.TypeTXT, answer: []string{`dns-version.cluster.local. 5 IN TXT "1.1.0"`}},

		// SRV of a ClusterIP Service: the Service name is the target, its
		// address in the additional section; port names are lowercased.
		{name: "_http._tcp.web.default.svc." + z, qtype: dns.TypeSRV,
			answer: []string{"_http._tcp.web.default.svc.cluster.local. 5 IN SRV 0 100 80 web.default.svc.cluster.local."},
			extra:  []string{"web.default.svc.cluster.local. 5 IN A 10.43.0.20"}},
		{name: "_dns._udp.web.default.svc." + z, qtype: dns.TypeSRV,
			answer: []string{"_dns._udp.web.default.svc.cluster.local. 5 IN SRV 0 100 53 web.default.svc.cluster.local."},
			extra:  []string{"web.default.svc.cluster.local. 5 IN A 10.43.0.20"}},
		{name: "_http._udp.web.default.svc." + z, qtype: dns.TypeSRV, rcode: dns.RcodeNameError},
		{name: "_tcp.web.default.svc." + z, qtype: dns.TypeSRV, nodata: true},

		// Headless: ready endpoints only, per-endpoint names by hostname or
		// dashed address.
		{name: "db.data.svc." + z, qtype: dns.TypeA, answer: []string{
			"db.data.svc.cluster.local. 5 IN A 10.42.0.5", "db.data.svc.cluster.local. 5 IN A 10.42.0.6"}},
		{name: "db-0.db.data.svc." + z, qtype: dns.TypeA, answer: []string{"db-0.db.data.svc.cluster.local. 5 IN A 10.42.0.5"}},
		{name: "10-42-0-6.db.data.svc." + z, qtype: dns.TypeA, answer: []string{"10-42-0-6.db.data.svc.cluster.local. 5 IN A 10.42.0.6"}},
		{name: "db-2.db.data.svc." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError}, // not ready
		{name: "_pg._tcp.db.data.svc." + z, qtype: dns.TypeSRV,
			answer: []string{
				"_pg._tcp.db.data.svc.cluster.local. 5 IN SRV 0 50 5432 10-42-0-6.db.data.svc.cluster.local.",
				"_pg._tcp.db.data.svc.cluster.local. 5 IN SRV 0 50 5432 db-0.db.data.svc.cluster.local.",
			},
			extra: []string{"10-42-0-6.db.data.svc.cluster.local. 5 IN A 10.42.0.6", "db-0.db.data.svc.cluster.local. 5 IN A 10.42.0.5"}},
		{name: "empty.default.svc." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError}, // headless, no ready endpoint

		// ExternalName: a CNAME, followed inside the zone and, through the
		// upstreams, outside it.
		{name: "alias.default.svc." + z, qtype: dns.TypeA, answer: []string{
			"alias.default.svc.cluster.local. 5 IN CNAME web.default.svc.cluster.local.",
			"web.default.svc.cluster.local. 5 IN A 10.43.0.20"}},
		{name: "alias.default.svc." + z, qtype: dns.TypeCNAME, answer: []string{
			"alias.default.svc.cluster.local. 5 IN CNAME web.default.svc.cluster.local."}},
		{name: "outside.default.svc." + z, qtype: dns.TypeA, answer: []string{
			"outside.default.svc.cluster.local. 5 IN CNAME www.upstream.test.",
			"www.upstream.test. 60 IN A 192.0.2.1"}},

		// A ClusterIP Service's ready endpoints have names of their own
		// (the PTR targets below); the Service name stays the ClusterIP.
		{name: "10-42-0-8.web.default.svc." + z, qtype: dns.TypeA, answer: []string{"10-42-0-8.web.default.svc.cluster.local. 5 IN A 10.42.0.8"}},
		{name: "10-42-0-9.web.default.svc." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError}, // not ready

		// PTR: Service addresses name the Service; ready endpoint
		// addresses <hostname or dashed address>.<service>, of headless
		// and ClusterIP Services alike; other reverse names go upstream
		// (without Config.ReverseRanges: see TestReverse).
		{name: "20.0.43.10.in-addr.arpa.", qtype: dns.TypePTR, answer: []string{"20.0.43.10.in-addr.arpa. 5 IN PTR web.default.svc.cluster.local."}},
		{name: "5.0.42.10.in-addr.arpa.", qtype: dns.TypePTR, answer: []string{"5.0.42.10.in-addr.arpa. 5 IN PTR db-0.db.data.svc.cluster.local."}},
		{name: "6.0.42.10.in-addr.arpa.", qtype: dns.TypePTR, answer: []string{"6.0.42.10.in-addr.arpa. 5 IN PTR 10-42-0-6.db.data.svc.cluster.local."}},
		{name: "8.0.42.10.in-addr.arpa.", qtype: dns.TypePTR, answer: []string{"8.0.42.10.in-addr.arpa. 5 IN PTR 10-42-0-8.web.default.svc.cluster.local."}},
		{name: "9.0.42.10.in-addr.arpa.", qtype: dns.TypePTR, answer: []string{"9.0.42.10.in-addr.arpa. 60 IN PTR from.upstream."}}, // not ready
		{name: "7.0.42.10.in-addr.arpa.", qtype: dns.TypePTR, answer: []string{"7.0.42.10.in-addr.arpa. 60 IN PTR from.upstream."}},

		// Pods, from the name.
		{name: "10-42-1-9.default.pod." + z, qtype: dns.TypeA, answer: []string{"10-42-1-9.default.pod.cluster.local. 5 IN A 10.42.1.9"}},
		{name: "10-42-1-9.default.pod." + z, qtype: dns.TypeAAAA, nodata: true},
		{name: "fd00--1.default.pod." + z, qtype: dns.TypeAAAA, answer: []string{"fd00--1.default.pod.cluster.local. 5 IN AAAA fd00::1"}},
		{name: "10-42-1-999.default.pod." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError},
		{name: "default.pod." + z, qtype: dns.TypeA, nodata: true},

		// Outside the zone: forwarded.
		{name: "www.upstream.test.", qtype: dns.TypeA, answer: []string{"www.upstream.test. 60 IN A 192.0.2.1"}},
		{name: "nothing.test.", qtype: dns.TypeA, rcode: dns.RcodeNameError},
	} {
		t.Run(tc.name+"/"+dns.TypeToString[tc.qtype], func(t *testing.T) {
			m := f.query(t, tc.name, tc.qtype)
			if m.Rcode != tc.rcode {
				t.Fatalf("rcode %s, want %s\n%v", dns.RcodeToString[m.Rcode], dns.RcodeToString[tc.rcode], m)
			}
			inZone := strings.HasSuffix(strings.ToLower(tc.name), z)
			if inZone && !m.Authoritative {
				t.Errorf("not authoritative\n%v", m)
			}
			if !m.RecursionAvailable {
				t.Errorf("RA not set")
			}
			got := texts(m.Answer)
			for i := range got {
				if strings.Contains(got[i], " SOA ") {
					f := strings.Fields(got[i])
					f[6] = "SERIAL"
					got[i] = strings.Join(f, " ")
				}
			}
			if want := slices.Sorted(slices.Values(tc.answer)); !slices.Equal(got, want) {
				t.Errorf("answer\n got %q\nwant %q", got, want)
			}
			if tc.extra != nil {
				if got := texts(m.Extra); !slices.Equal(got, tc.extra) {
					t.Errorf("additional\n got %q\nwant %q", got, tc.extra)
				}
			}
			if tc.nodata && !soa(m) {
				t.Errorf("NODATA without the SOA in authority\n%v", m)
			}
			if inZone && tc.rcode == dns.RcodeNameError && !soa(m) {
				t.Errorf("NXDOMAIN without the SOA in authority\n%v", m)
			}
		})
	}
}

func TestEDNSAndTCP(t *testing.T) {
	f := start(t, Config{}, cluster()...)
	m := new(dns.Msg)
	m.SetQuestion("web.default.svc.cluster.local.", dns.TypeA)
	m.SetEdns0(4096, false)
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, f.addr)
	if err != nil {
		t.Fatal(err)
	}
	if o := r.IsEdns0(); o == nil || o.UDPSize() != ednsSize {
		t.Errorf("EDNS query answered without our OPT: %v", r)
	}
	if r := exchange(t, "tcp", f.addr, "db.data.svc.cluster.local.", dns.TypeA); len(r.Answer) != 2 {
		t.Errorf("over TCP: %v", r)
	}
}

func TestRotation(t *testing.T) {
	f := start(t, Config{}, cluster()...)
	first := map[string]bool{}
	for range 4 {
		m := f.query(t, "db.data.svc.cluster.local.", dns.TypeA)
		first[m.Answer[0].(*dns.A).A.String()] = true
	}
	if len(first) != 2 {
		t.Errorf("the first address never changes: %v", first)
	}
}

func TestUpdates(t *testing.T) {
	f := start(t, Config{}, cluster()...)
	ctx := context.Background()
	eps := f.client.DiscoveryV1().EndpointSlices("data")
	s, err := eps.Get(ctx, "db-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Endpoints[1].Conditions.Ready = ptr.To(true) // db-2 becomes ready
	if _, err := eps.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Changes must be visible within 1 s.
	poll.Until(t, time.Second, "db-2 in the answers once ready", func() bool {
		m := f.query(t, "db-2.db.data.svc.cluster.local.", dns.TypeA)
		return m.Rcode == dns.RcodeSuccess && len(m.Answer) == 1
	})

	// A new Service, and a deleted one.
	svcs := f.client.CoreV1().Services("default")
	if _, err := svcs.Create(ctx, service("default", "new", "10.43.0.99"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := svcs.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, time.Second, "the new Service answered and the deleted one gone", func() bool {
		return len(f.query(t, "new.default.svc.cluster.local.", dns.TypeA).Answer) == 1 &&
			f.query(t, "web.default.svc.cluster.local.", dns.TypeA).Rcode == dns.RcodeNameError
	})
}

func TestTruncation(t *testing.T) {
	f := start(t, Config{}, cluster()...)
	// The upstream truncates over UDP: the resolver asks it again over
	// TCP, then gives a UDP client what fits, with TC set.
	m := f.query(t, "big.upstream.test.", dns.TypeA)
	if !m.Truncated || len(m.Answer) >= 60 {
		t.Errorf("UDP client: truncated %v, %d answers; want TC and fewer than 60", m.Truncated, len(m.Answer))
	}
	if f.up.tcp.Load() == 0 {
		t.Error("the resolver did not retry over TCP")
	}
	m = exchange(t, "tcp", f.addr, "big.upstream.test.", dns.TypeA)
	if m.Truncated || len(m.Answer) != 60 {
		t.Errorf("TCP client: truncated %v, %d answers; want all 60", m.Truncated, len(m.Answer))
	}
	// The miekg client retries over TCP by itself when told to.
	c := &dns.Client{Timeout: 5 * time.Second}
	q := new(dns.Msg)
	q.SetQuestion("big.upstream.test.", dns.TypeA)
	q.SetEdns0(dns.DefaultMsgSize, false)
	r, _, err := c.Exchange(q, f.addr)
	if err != nil || len(r.Answer) != 60 {
		t.Errorf("EDNS 4096 client: %v answers %d", err, len(r.Answer))
	}
}

func TestNextUpstream(t *testing.T) {
	// A UDP port nobody listens on answers with ICMP unreachable; a server
	// answering SERVFAIL counts as failing too.
	dead, err := net.ListenPacket("udp", "127.0.0.73:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.LocalAddr().String()
	dead.Close()
	broken := startUpstream(t, "127.0.0.74", func(_ dns.Question, _ bool, m *dns.Msg) { m.Rcode = dns.RcodeServerFailure })
	good := defaultUpstream(t)
	f := start(t, Config{Upstreams: []string{deadAddr, broken.addr, good.addr}}, cluster()...)
	m := f.query(t, "www.upstream.test.", dns.TypeA)
	if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		t.Fatalf("got %v", m)
	}

	// All failing: SERVFAIL to the client.
	g := start(t, Config{Upstreams: []string{deadAddr}}, cluster()...)
	if m := g.query(t, "www.upstream.test.", dns.TypeA); m.Rcode != dns.RcodeServerFailure {
		t.Fatalf("no upstream answers: got %v", m)
	}
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "dns.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestForwardFile(t *testing.T) {
	answerWith := func(ip string) func(dns.Question, bool, *dns.Msg) {
		return func(q dns.Question, _ bool, m *dns.Msg) {
			m.Answer = append(m.Answer, rr(t, q.Name+" 60 IN A "+ip))
		}
	}
	corp := startUpstream(t, "127.0.0.72", answerWith("198.51.100.1"))
	lab := startUpstream(t, "127.0.0.75", answerWith("198.51.100.2"))
	path := writeFile(t, fmt.Sprintf(`forward:
- domain: corp.example
  servers: [%q]
- domain: Lab.Corp.Example.
  servers: [%q]
`, corp.addr, lab.addr))
	f := start(t, Config{ForwardFile: path}, cluster()...)
	for name, want := range map[string]string{
		"www.corp.example.":              "198.51.100.1",
		"corp.example.":                  "198.51.100.1",
		"a.lab.corp.example.":            "198.51.100.2", // the longest match wins
		"A.LAB.Corp.example.":            "198.51.100.2",
		"www.upstream.test.":             "192.0.2.1", // the default upstreams
		"notcorp.example.":               "",          // not inside corp.example
		"web.default.svc.cluster.local.": "10.43.0.20",
	} {
		m := f.query(t, name, dns.TypeA)
		got := ""
		if len(m.Answer) == 1 {
			got = m.Answer[0].(*dns.A).A.String()
		}
		if got != want {
			t.Errorf("%s: got %q, want %q (%v)", name, got, want, m)
		}
	}

	// JSON is YAML too; "." replaces the default upstreams.
	rules, err := LoadForwardFile(writeFile(t, `{"forward": [{"domain": ".", "servers": ["127.0.0.1", "[::1]:5353"]}]}`), "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if want := []ForwardRule{{Domain: ".", Servers: []string{"127.0.0.1:53", "[::1]:5353"}}}; fmt.Sprint(rules) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", rules, want)
	}
}

func TestForwardFileRefused(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{``, "forward: missing"},
		{`forwards: []`, `unknown field "forwards"`},
		{`forward: [{domain: corp.example, servers: [10.0.0.1], port: 53}]`, `unknown field "forward[0].port"`},
		{`forward: {domain: corp.example}`, "forward"},
		{`forward: [{servers: [10.0.0.1]}]`, "forward[0].domain: missing"},
		{`forward: [{domain: "bad..name", servers: [10.0.0.1]}]`, "forward[0].domain: \"bad..name\" is not a DNS name"},
		{`forward: [{domain: svc.cluster.local, servers: [10.0.0.1]}]`, "forward[0].domain: \"svc.cluster.local\" is inside the cluster domain"},
		{`forward: [{domain: a.example, servers: []}]`, "forward[0].servers: missing"},
		{`forward: [{domain: a.example, servers: [10.0.0.1, dns.corp]}]`, "forward[0].servers[1]: \"dns.corp\" is not an IP address or IP:port"},
		{`forward: [{domain: a.example, servers: ["10.0.0.1:99999"]}]`, "forward[0].servers[0]"},
		{"forward:\n- {domain: a.example, servers: [10.0.0.1]}\n- {domain: A.example., servers: [10.0.0.2]}", "forward[1].domain: \"A.example.\" repeats forward[0]"},
	} {
		path := writeFile(t, tc.text)
		_, err := LoadForwardFile(path, "cluster.local")
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%q: got %v, want an error naming %s and containing %q", tc.text, err, path, tc.want)
		}
		// New refuses it the same way.
		if _, err := New(Config{Client: fake.NewClientset(), Domain: "cluster.local", Listen: []string{resolverIP + ":0"}, ForwardFile: path}); err == nil {
			t.Errorf("%q: New accepted it", tc.text)
		}
	}
}

func TestResolvConfUpstreams(t *testing.T) {
	p := writeFile(t, "# comment\nsearch example\nnameserver 127.0.0.53\nnameserver ::1\nnameserver 127.0.0.53\noptions edns0\nnameserver bogus\n")
	got, err := ResolvConfUpstreams(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"127.0.0.53:53", "[::1]:53"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := ResolvConfUpstreams(writeFile(t, "search x\n")); err == nil {
		t.Error("no nameserver: no error")
	}
}

func TestNewRefuses(t *testing.T) {
	c := fake.NewClientset()
	for _, cfg := range []Config{
		{Domain: "cluster.local", Listen: []string{resolverIP + ":0"}},
		{Client: c, Domain: "", Listen: []string{resolverIP + ":0"}},
		{Client: c, Domain: "cluster.local"},
		{Client: c, Domain: "cluster.local", Listen: []string{"nohost"}},
		{Client: c, Domain: "cluster.local", Listen: []string{resolverIP + ":0"}, Upstreams: []string{"dns.example"}},
	} {
		if s, err := New(cfg); err == nil {
			s.Close()
			t.Errorf("%+v: accepted", cfg)
		}
	}
	// An upstream that is the resolver itself is dropped.
	s, err := New(Config{Client: c, Domain: "cluster.local", Listen: []string{"127.0.0.76:5399"}, Upstreams: []string{"127.0.0.76:5399", "127.0.0.71"},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !slices.Equal(s.fwd.def, []string{"127.0.0.71:53"}) {
		t.Errorf("upstreams %v", s.fwd.def)
	}
}
