// Package dns owns the node's cluster DNS resolver: the records of the
// Kubernetes DNS specification (schema 1.1.0) for Services, their
// EndpointSlices and pods, served on the --cluster-dns address. k3sm has no
// CoreDNS add-on; the node process answers cluster names from an in-memory
// index and forwards everything else to the host's resolvers (or, per
// domain, to the servers of the --dns-config file).
//
// The index is rebuilt from informer caches after Service and EndpointSlice
// events (coalesced) and swapped in with one atomic store, so queries never
// take a lock and never see a half-built index.
package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"k8s.io/client-go/kubernetes"
)

const (
	// TTL of every record served from the index (CoreDNS's default for its
	// kubernetes plugin): short, because Services and endpoints change.
	TTL = 5
	// SchemaVersion is the DNS specification version, served as the TXT
	// record dns-version.<zone>.
	SchemaVersion = "1.1.0"
	// ednsSize is the UDP payload size this server advertises (the DNS
	// flag day 2020 value, safe against fragmentation).
	ednsSize = 1232
	// rebuildGap is the least time between two index rebuilds: a burst of
	// events (a Deployment rolling) costs one rebuild per gap, not one each.
	rebuildGap = 50 * time.Millisecond
	// upstreamTimeout bounds one exchange with one upstream; stub resolvers
	// give up after 5 s, so a dead first upstream leaves time for the next.
	upstreamTimeout = 2 * time.Second
	// maxForwards bounds queries waiting on upstreams: with a dead upstream
	// each waits seconds, and a flood must not grow without limit.
	maxForwards = 1024
)

// Config is what a Server serves and where.
type Config struct {
	Client kubernetes.Interface // reads Services and EndpointSlices (see EnsureRBAC)
	Domain string               // cluster domain, e.g. "cluster.local"
	// Listen are host:port addresses, each served over UDP and TCP (e.g.
	// "10.43.0.10:53"). Port 0 picks a free port, the same for both.
	Listen []string
	// Upstreams are the servers (IP or IP:port, port 53 by default) for
	// names outside the cluster domain; see ResolvConfUpstreams. Entries
	// equal to a Listen address are dropped, as they would loop.
	Upstreams []string
	// ReverseRanges are the Service and pod ranges: their reverse names
	// (in-addr.arpa, ip6.arpa) are answered here and never forwarded, as no
	// resolver outside the cluster knows them.
	ReverseRanges []netip.Prefix
	// PodNamespace, if set, names the namespace of a pod address on this
	// node; the PTR of such an address that backs no Service is then
	// <a-b-c-d>.<namespace>.pod.<zone>. It is called on the query path.
	PodNamespace func(netip.Addr) (namespace string, ok bool)
	// ForwardFile is the optional --dns-config file of per-domain forwarding
	// rules (see LoadForwardFile).
	ForwardFile string
	Log         *slog.Logger
}

// Server is the resolver. New binds its sockets; Run serves them.
type Server struct {
	client kubernetes.Interface
	zone   string // lowercase, fully qualified: "cluster.local."
	log    *slog.Logger
	fwd    *forwarder
	udp    []net.PacketConn
	tcp    []net.Listener

	index atomic.Pointer[index]
	kick  chan struct{} // informer events: the index is stale
	ready chan struct{} // closed once the first index is served
	rr    atomic.Uint32 // rotates multi-record answers
	slots chan struct{} // one per forwarded query in progress (maxForwards)

	reverseRanges []netip.Prefix
	podNS         func(netip.Addr) (string, bool)
}

// New checks cfg, reads the forward file and binds every Listen address
// (UDP and TCP), so a bad address fails here and Addrs is known before Run.
// The sockets are closed when Run returns, or by Close if Run is never called.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("dns: Config.Client is required")
	}
	zone := strings.ToLower(dns.Fqdn(strings.TrimSpace(cfg.Domain)))
	if zone == "." || !dnsName(zone) {
		return nil, fmt.Errorf("dns: cluster domain %q is not a DNS name; use e.g. cluster.local", cfg.Domain)
	}
	if len(cfg.Listen) == 0 {
		return nil, errors.New("dns: Config.Listen needs at least one host:port")
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	s := &Server{
		client: cfg.Client,
		zone:   zone,
		log:    log,
		kick:   make(chan struct{}, 1),
		ready:  make(chan struct{}),
		slots:  make(chan struct{}, maxForwards),
		podNS:  cfg.PodNamespace,
	}
	for i, p := range cfg.ReverseRanges {
		if !p.IsValid() {
			return nil, fmt.Errorf("dns: Config.ReverseRanges[%d] is not a valid prefix; use e.g. 10.43.0.0/16", i)
		}
		s.reverseRanges = append(s.reverseRanges, p.Masked())
	}
	var rules []ForwardRule
	if cfg.ForwardFile != "" {
		var err error
		if rules, err = LoadForwardFile(cfg.ForwardFile, cfg.Domain); err != nil {
			return nil, err
		}
	}
	for _, addr := range cfg.Listen {
		pc, l, err := listen(addr)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("dns: listen %s: %w", addr, err)
		}
		s.udp, s.tcp = append(s.udp, pc), append(s.tcp, l)
	}
	var ups []string
	for i, u := range cfg.Upstreams {
		hp, err := serverAddr(u)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("dns: Config.Upstreams[%d]: %w", i, err)
		}
		if s.listensOn(hp) {
			log.Warn("dns: dropping an upstream that is this resolver's own address", "upstream", hp)
			continue
		}
		ups = append(ups, hp)
	}
	s.fwd = newForwarder(ups, rules)
	return s, nil
}

// Addrs are the bound addresses, one per Listen entry (ports resolved).
func (s *Server) Addrs() []string {
	out := make([]string, len(s.udp))
	for i, pc := range s.udp {
		out[i] = pc.LocalAddr().String()
	}
	return out
}

// Ready is closed once cluster names are answered (the informer caches
// synced and the first index is in place). Until then names in the cluster
// domain get SERVFAIL, so clients retry instead of caching NXDOMAIN;
// forwarding works from the start.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Close closes the sockets of a Server whose Run was never called.
func (s *Server) Close() {
	for _, pc := range s.udp {
		pc.Close()
	}
	for _, l := range s.tcp {
		l.Close()
	}
}

// Run watches Services and EndpointSlices and serves DNS until ctx is done.
// It returns nil after ctx ends, or the first error of a listener.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := newWatcher(s.client, s.markStale)
	w.start(ctx)

	errc := make(chan error, len(s.udp)+len(s.tcp))
	var servers []*dns.Server
	var wg sync.WaitGroup
	serve := func(srv *dns.Server) {
		servers = append(servers, srv)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.ActivateAndServe(); err != nil && ctx.Err() == nil {
				errc <- err
			}
		}()
	}
	for _, pc := range s.udp {
		serve(&dns.Server{PacketConn: pc, Handler: s, UDPSize: 4096})
	}
	for _, l := range s.tcp {
		serve(&dns.Server{Listener: l, Handler: s})
	}
	s.log.Info("dns: serving", "addrs", s.Addrs(), "domain", strings.TrimSuffix(s.zone, "."), "upstreams", s.fwd.def)

	go s.indexLoop(ctx, w)

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		err = fmt.Errorf("dns: %w", err)
	}
	cancel()
	for _, srv := range servers {
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		_ = srv.ShutdownContext(sctx)
		scancel()
	}
	// Closing the sockets also ends a server that was not started yet when
	// Shutdown came (miekg refuses to shut those down).
	s.Close()
	wg.Wait()
	w.stop()
	return err
}

func (s *Server) markStale() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// indexLoop builds the first index once the caches synced, then rebuilds
// after events, at most once per rebuildGap.
func (s *Server) indexLoop(ctx context.Context, w *watcher) {
	if !w.waitSynced(ctx) {
		return
	}
	s.rebuild(w)
	close(s.ready)
	s.log.Info("dns: cluster records ready")
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		s.rebuild(w)
		select {
		case <-ctx.Done():
			return
		case <-time.After(rebuildGap):
		}
	}
}

func (s *Server) rebuild(w *watcher) {
	svcs, slices := w.list()
	s.index.Store(buildIndex(s.zone, svcs, slices))
}

func (s *Server) listensOn(hostport string) bool {
	for _, pc := range s.udp {
		if pc.LocalAddr().String() == hostport {
			return true
		}
	}
	return false
}

// listen binds addr over UDP and TCP. With port 0 it asks the kernel for a
// UDP port and binds TCP to the same one, retrying if that is taken.
func listen(addr string) (net.PacketConn, net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, err
	}
	var lastErr error
	for range 10 {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, err
		}
		tcpAddr := addr
		if port == "0" {
			tcpAddr = pc.LocalAddr().String()
		}
		l, err := net.Listen("tcp", tcpAddr)
		if err == nil {
			return pc, l, nil
		}
		pc.Close()
		if port != "0" {
			return nil, nil, err
		}
		lastErr = err
	}
	return nil, nil, fmt.Errorf("no port free on %s for both UDP and TCP: %w", host, lastErr)
}

// serverAddr normalizes an upstream: an IP, or IP:port; port 53 by default.
// Names are refused: resolving them would need a resolver.
func serverAddr(s string) (string, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.String(), nil
	}
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return netip.AddrPortFrom(a, 53).String(), nil
	}
	return "", fmt.Errorf("%q is not an IP address or IP:port; write e.g. 10.0.0.2 or 10.0.0.2:5353 (names are not resolved)", s)
}

func dnsName(s string) bool {
	_, ok := dns.IsDomainName(s)
	return ok
}
