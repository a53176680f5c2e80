package dns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/miekg/dns"
	"sigs.k8s.io/yaml"

	"github.com/k3sm-dev/k3sm/internal/agent/resolvconf"
)

// ForwardRule sends the names inside Domain to Servers instead of the
// default upstreams. Domain "." replaces the default upstreams.
type ForwardRule struct {
	Domain  string   `json:"domain"`
	Servers []string `json:"servers"`
}

// LoadForwardFile reads a --dns-config file (YAML or JSON) and checks it:
// unknown fields, domains that are not DNS names or lie inside the cluster
// domain (which the node answers itself), repeated domains, and servers
// that are not IP or IP:port are refused with the field and the fix. The
// rules come back normalized: lowercase fully qualified domains, servers
// as IP:port.
func LoadForwardFile(path, clusterDomain string) ([]ForwardRule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dns-config: %w", err)
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("dns-config %s: %s", path, fmt.Sprintf(format, a...))
	}
	entries, err := parseForwardFile(data)
	if err != nil {
		return nil, bad("%v", err)
	}
	zone := strings.ToLower(dns.Fqdn(clusterDomain))
	var rules []ForwardRule
	first := map[string]int{}
	for i, r := range entries {
		d := strings.ToLower(dns.Fqdn(strings.TrimSpace(r.Domain)))
		switch {
		case strings.TrimSpace(r.Domain) == "":
			return nil, bad("forward[%d].domain: missing; name the domain whose names go to servers (\".\" for all others)", i)
		case !dnsName(d):
			return nil, bad("forward[%d].domain: %q is not a DNS name; write e.g. corp.example", i, r.Domain)
		case zone != "." && inZone(d, zone):
			return nil, bad("forward[%d].domain: %q is inside the cluster domain %q, which the node answers itself; remove it", i, r.Domain, strings.TrimSuffix(zone, "."))
		}
		if j, ok := first[d]; ok {
			return nil, bad("forward[%d].domain: %q repeats forward[%d]; put all its servers in one entry", i, r.Domain, j)
		}
		first[d] = i
		if len(r.Servers) == 0 {
			return nil, bad("forward[%d].servers: missing; list at least one server as IP or IP:port", i)
		}
		rule := ForwardRule{Domain: d}
		for j, s := range r.Servers {
			hp, err := serverAddr(strings.TrimSpace(s))
			if err != nil {
				return nil, bad("forward[%d].servers[%d]: %v", i, j, err)
			}
			rule.Servers = append(rule.Servers, hp)
		}
		rules = append(rules, rule)
	}
	return rules, nil
}

// parseForwardFile decodes the file's structure:
//
//	forward:
//	- domain: corp.example
//	  servers: ["10.0.0.2", "127.0.0.1:5353"]
//
// Unknown fields are refused by their path (a misspelt "server" would
// otherwise silently forward nothing).
func parseForwardFile(data []byte) ([]ForwardRule, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("not YAML or JSON: %v", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		return nil, errors.New("not a mapping; write forward: [{domain: ..., servers: [...]}]")
	}
	for k := range top {
		if k != "forward" {
			return nil, fmt.Errorf("unknown field %q; the only field is forward, a list of {domain, servers}", k)
		}
	}
	raw, ok := top["forward"]
	if !ok {
		return nil, errors.New("forward: missing; write e.g. forward: [{domain: corp.example, servers: [10.0.0.2]}]")
	}
	var list []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errors.New("forward: not a list of {domain, servers}; write e.g. forward: [{domain: corp.example, servers: [10.0.0.2]}]")
	}
	rules := make([]ForwardRule, len(list))
	for i, fields := range list {
		for k, v := range fields {
			switch k {
			case "domain":
				if err := json.Unmarshal(v, &rules[i].Domain); err != nil {
					return nil, fmt.Errorf("forward[%d].domain: not a string", i)
				}
			case "servers":
				if err := json.Unmarshal(v, &rules[i].Servers); err != nil {
					return nil, fmt.Errorf("forward[%d].servers: not a list of strings; write e.g. servers: [10.0.0.2, \"10.0.0.3:5353\"]", i)
				}
			default:
				return nil, fmt.Errorf("unknown field \"forward[%d].%s\"; an entry has domain and servers", i, k)
			}
		}
	}
	return rules, nil
}

// ResolvConfUpstreams returns the nameservers of a resolv.conf file (e.g.
// /etc/resolv.conf) as IP:port. It is an error if there are none.
func ResolvConfUpstreams(path string) ([]string, error) {
	f, err := resolvconf.Read(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range f.Nameservers {
		if hp, err := serverAddr(n); err == nil && !slices.Contains(out, hp) {
			out = append(out, hp)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s lists no nameserver", path)
	}
	return out, nil
}

type forwarder struct {
	def   []string      // default upstreams
	rules []ForwardRule // longest domain first
	udp   *dns.Client
	tcp   *dns.Client
}

func newForwarder(def []string, rules []ForwardRule) *forwarder {
	rules = slices.Clone(rules)
	slices.SortStableFunc(rules, func(a, b ForwardRule) int {
		return dns.CountLabel(b.Domain) - dns.CountLabel(a.Domain)
	})
	return &forwarder{
		def:   def,
		rules: rules,
		udp:   &dns.Client{Net: "udp", Timeout: upstreamTimeout, UDPSize: dns.DefaultMsgSize},
		tcp:   &dns.Client{Net: "tcp", Timeout: upstreamTimeout},
	}
}

// servers are the upstreams for lname: those of the longest matching rule,
// else the defaults.
func (f *forwarder) servers(lname string) []string {
	for _, r := range f.rules {
		if r.Domain == "." || inZone(lname, r.Domain) {
			return r.Servers
		}
	}
	return f.def
}

var errNoUpstream = errors.New("no upstream DNS server configured")

// exchange asks the upstreams of lname in turn: over UDP, again over TCP
// when the answer was truncated (or at once over TCP when the client came
// over TCP, as it did because an answer was too big), the next server on
// an error, SERVFAIL or REFUSED. It returns the last answer when every
// server failed that way.
func (f *forwarder) exchange(ctx context.Context, req *dns.Msg, lname string, overTCP bool) (*dns.Msg, error) {
	servers := f.servers(lname)
	if len(servers) == 0 {
		return nil, errNoUpstream
	}
	var last *dns.Msg
	var lastErr error
	for _, srv := range servers {
		c := f.udp
		if overTCP {
			c = f.tcp
		}
		resp, _, err := c.ExchangeContext(ctx, req, srv)
		if err == nil && resp.Truncated && !overTCP {
			resp, _, err = f.tcp.ExchangeContext(ctx, req, srv)
		}
		if err != nil {
			lastErr = fmt.Errorf("%s: %w", srv, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if resp.Rcode == dns.RcodeServerFailure || resp.Rcode == dns.RcodeRefused {
			last = resp
			continue
		}
		return resp, nil
	}
	if last != nil {
		return last, nil
	}
	return nil, lastErr
}

// forwardQuery answers r from the upstreams, or SERVFAIL.
func (s *Server) forwardQuery(w dns.ResponseWriter, r *dns.Msg, lname string) {
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		m := reply(r)
		m.Rcode = dns.RcodeServerFailure
		respond(w, r, m)
		return
	}
	_, overTCP := w.RemoteAddr().(*net.TCPAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*upstreamTimeout)
	defer cancel()
	resp, err := s.fwd.exchange(ctx, r, lname, overTCP)
	if err != nil {
		s.log.Debug("dns: forward", "name", r.Question[0].Name, "err", err)
		m := reply(r)
		m.Rcode = dns.RcodeServerFailure
		respond(w, r, m)
		return
	}
	resp.Id = r.Id
	resp.RecursionAvailable = true // this server recursed for the client
	write(w, r, resp)
}
