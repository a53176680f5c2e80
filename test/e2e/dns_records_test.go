package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// clusterDNS is the node's resolver with the server's default --cluster-dns.
// The test's network namespace is the node's, where that address is bound.
const clusterDNS = "10.43.0.10:53"

// dnsQuery asks the cluster DNS one question over UDP, as dig would.
func dnsQuery(name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, clusterDNS)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, dns.TypeToString[qtype], err)
	}
	return r, nil
}

// dnsAnswer is one expected answer: its rcode, the answer section's data
// (record type and value, e.g. "A 10.43.0.5", order ignored; with
// contains, a subset of it), and whether the authority section carries the
// SOA (negative answers).
type dnsAnswer struct {
	rcode    int
	answer   []string
	contains bool
	soa      bool
}

// rdata is a record as "TYPE value" (the value without owner, TTL, class).
func rdata(rr dns.RR) string {
	h := rr.Header()
	return dns.TypeToString[h.Rrtype] + " " + strings.TrimPrefix(rr.String(), h.String())
}

func (want dnsAnswer) check(m *dns.Msg) error {
	var got []string
	for _, rr := range m.Answer {
		got = append(got, rdata(rr))
	}
	slices.Sort(got)
	exp := slices.Sorted(slices.Values(want.answer))
	switch {
	case m.Rcode != want.rcode:
		return fmt.Errorf("rcode %s, want %s\n%v", dns.RcodeToString[m.Rcode], dns.RcodeToString[want.rcode], m)
	case !m.Authoritative:
		return fmt.Errorf("not authoritative (forwarded?)\n%v", m)
	case !want.contains && !slices.Equal(got, exp):
		return fmt.Errorf("answer %q, want %q", got, exp)
	case want.contains && !subset(exp, got):
		return fmt.Errorf("answer %q, want it to hold %q", got, exp)
	case want.soa && (len(m.Ns) != 1 || m.Ns[0].Header().Rrtype != dns.TypeSOA):
		return fmt.Errorf("authority %v, want the SOA", m.Ns)
	}
	return nil
}

func subset(small, big []string) bool {
	for _, s := range small {
		if !slices.Contains(big, s) {
			return false
		}
	}
	return true
}

// expectDNS polls the cluster DNS until name's qtype answer is want: the
// index follows the API a moment after each change.
func expectDNS(t *testing.T, name string, qtype uint16, want dnsAnswer) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("dig %s %s", name, dns.TypeToString[qtype]), func() error {
		m, err := dnsQuery(name, qtype)
		if err != nil {
			return err
		}
		return want.check(m)
	})
	t.Logf("dig %s %s: ok", name, dns.TypeToString[qtype])
}

// reverseName is ip's PTR owner name, e.g. 4.3.2.1.in-addr.arpa.
func reverseName(t *testing.T, ip string) string {
	t.Helper()
	n, err := dns.ReverseAddr(ip)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// dashedIP is an IPv4 address as one DNS label: 10.1.2.3 → 10-1-2-3.
func dashedIP(ip string) string { return strings.ReplaceAll(ip, ".", "-") }

// endpointReady watches the EndpointSlices of Service svc (namespace
// default) until pod is a ready endpoint, and returns its address and when
// the test saw that. The watch starts before start (which makes the pod)
// runs, so no event is missed.
func endpointReady(t *testing.T, c kubernetes.Interface, svc, pod string, start func()) (ip string, at time.Time) {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc}
	list, err := c.DiscoveryV1().EndpointSlices("default").List(ctx(t), sel)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sel.ResourceVersion = list.ResourceVersion
	w, err := c.DiscoveryV1().EndpointSlices("default").Watch(wctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	start()
	for ev := range w.ResultChan() {
		s, ok := ev.Object.(*discoveryv1.EndpointSlice)
		if !ok || ev.Type == watch.Deleted {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.TargetRef != nil && ep.TargetRef.Name == pod && len(ep.Addresses) > 0 &&
				ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				return ep.Addresses[0], time.Now()
			}
		}
	}
	t.Fatalf("pod %s never became a ready endpoint of %s", pod, svc)
	return "", time.Time{}
}

// firstAnswerFrom dials addr from the node every 25 ms until the answer
// comes from a backend at ip, and returns when; it gives up after limit.
func firstAnswerFrom(addr, ip string, limit time.Duration) (time.Time, error) {
	// Not poll: this times the first answer and returns an error for its
	// caller to report.
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.SetDeadline(time.Now().Add(time.Second))
			b := make([]byte, 256)
			n, _ := c.Read(b)
			c.Close()
			last = string(b[:n])
			if strings.Contains(last, " to "+ip+":") {
				return time.Now(), nil
			}
		} else {
			last = err.Error()
		}
		time.Sleep(25 * time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("no answer from %s through %s within %s (last: %q)", ip, addr, limit, last)
}
