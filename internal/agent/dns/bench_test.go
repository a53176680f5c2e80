package dns

import (
	"fmt"
	"net"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// discard is a ResponseWriter that packs the answer as the real one does
// and drops it.
type discard struct{ buf []byte }

func (d *discard) LocalAddr() net.Addr  { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 70), Port: 53} }
func (d *discard) RemoteAddr() net.Addr { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 71), Port: 5000} }
func (d *discard) WriteMsg(m *dns.Msg) error {
	var err error
	d.buf, err = m.PackBuffer(d.buf)
	return err
}
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) Close() error                { return nil }
func (d *discard) TsigStatus() error           { return nil }
func (d *discard) TsigTimersOnly(bool)         {}
func (d *discard) Hijack()                     {}

// BenchmarkServeDNS is the handler's share of a cluster A query (no
// sockets): go test -bench ServeDNS -benchmem ./internal/agent/dns/
func BenchmarkServeDNS(b *testing.B) {
	var svcs []*corev1.Service
	for i := range 1000 {
		svcs = append(svcs, service("default", fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.43.%d.%d", i/250, i%250+1)))
	}
	s := &Server{zone: "cluster.local.", fwd: newForwarder(nil, nil)}
	s.index.Store(buildIndex(s.zone, svcs, []*discoveryv1.EndpointSlice{}))
	for _, name := range []string{"svc-7.default.svc.cluster.local.", "nope.default.svc.cluster.local."} {
		b.Run(name, func(b *testing.B) {
			w := &discard{}
			for b.Loop() {
				r := new(dns.Msg)
				r.SetQuestion(name, dns.TypeA)
				s.ServeDNS(w, r)
			}
		})
	}
}
