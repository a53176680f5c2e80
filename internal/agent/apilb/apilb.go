// Package apilb owns how a node (an agent, or a server's own node) reaches
// the Kubernetes API when there are several servers: a TCP load balancer on
// a loopback address, as k3s's agents have on 127.0.0.1:6444, that the
// node's clients dial instead of any one apiserver. It sticks to one server
// while that server accepts connections and moves a client's connection
// over to the next one, unnoticed, when a dial fails; TLS passes through
// untouched. Follow keeps its list equal to the ready endpoints of the
// `kubernetes` Service, and a state file keeps that list across restarts,
// so losing any one server disconnects no node.
package apilb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/backoff"
)

const (
	defaultDialTimeout = 3 * time.Second
	// defaultRetryAfter is how long a server whose dial failed is passed
	// over for new connections while another is not failed.
	defaultRetryAfter = 5 * time.Second
)

// LB is a TCP load balancer on a loopback address over the apiservers'
// addresses ("host:port").
type LB struct {
	ln          net.Listener
	log         *slog.Logger
	stateFile   string
	dialTimeout time.Duration
	retryAfter  time.Duration
	now         func() time.Time

	// persistMu orders Updates, so the state file ends with the last list.
	persistMu sync.Mutex

	mu      sync.Mutex
	order   []string             // the servers, in order of preference
	cur     string               // the one new connections go to; always in order
	failed  map[string]time.Time // servers whose last dial failed: passed over until then
	conns   map[*proxied]struct{}
	allDown bool // the last client connection found no server: logged once
	running bool
	closed  bool // Run has ended: no new proxied connections
}

// Options for New.
type Options struct {
	// Listen is the address to listen on, e.g. "127.0.0.1:6444" (port 0:
	// any free port).
	Listen string
	// Servers are the initial apiserver addresses ("host:port"), in order
	// of preference; at least one.
	Servers []string
	// StateFile, when set, keeps the last known server list (JSON, written
	// atomically, mode 0600) so that an agent restarted while its first
	// server is down still finds the others; New merges what it holds
	// after Servers (Servers first, no duplicates).
	StateFile string
	// DialTimeout per backend attempt (default 3s).
	DialTimeout time.Duration
	Log         *slog.Logger // nil: discard
}

// state is the StateFile's content.
type state struct {
	Servers []string `json:"servers"`
}

// proxied is one client connection spliced to one server.
type proxied struct {
	client, backend net.Conn
	server          string
}

func (p *proxied) close() {
	p.client.Close()
	p.backend.Close()
}

// New validates o and listens on o.Listen at once, so Addr is known before
// Run. A StateFile that cannot be read or parsed is logged and ignored:
// Servers alone still work.
func New(o Options) (*LB, error) {
	if len(o.Servers) == 0 {
		return nil, errors.New("apilb: no apiserver address given: pass at least one server as host:port, e.g. 10.0.0.1:6443")
	}
	if o.Listen == "" {
		return nil, errors.New("apilb: no listen address given: pass a loopback host:port, e.g. 127.0.0.1:6444")
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var order []string
	for _, s := range o.Servers {
		c, err := canonical(s)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(order, c) {
			order = append(order, c)
		}
	}
	if o.StateFile != "" {
		for _, s := range readState(o.StateFile, log) {
			if !slices.Contains(order, s) {
				order = append(order, s)
			}
		}
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return nil, fmt.Errorf("apilb: listening on %s for the apiserver load balancer: %w (is another k3sm agent running on this host, or the port taken? choose another)", o.Listen, err)
	}
	lb := &LB{
		ln:          ln,
		log:         log,
		stateFile:   o.StateFile,
		dialTimeout: o.DialTimeout,
		retryAfter:  defaultRetryAfter,
		now:         time.Now,
		order:       order,
		cur:         order[0],
		failed:      map[string]time.Time{},
		conns:       map[*proxied]struct{}{},
	}
	if lb.dialTimeout <= 0 {
		lb.dialTimeout = defaultDialTimeout
	}
	// Saved at once: the servers a join just listed are known after a
	// restart even if the list never changes.
	lb.persist(order)
	return lb, nil
}

// canonical checks that s is host:port (an IP address or a DNS name, a port
// 1-65535) and returns it with its port in decimal without leading zeros.
func canonical(s string) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("apilb: apiserver address %q is not host:port (%s): give each server as host:port, e.g. 10.0.0.1:6443", s, why)
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		if ae, ok := err.(*net.AddrError); ok {
			return "", bad(ae.Err)
		}
		return "", bad(err.Error())
	}
	if host == "" {
		return "", bad("no host")
	}
	if _, err := netip.ParseAddr(host); err != nil && !isDNSName(host) {
		return "", bad("host is neither an IP address nor a DNS name")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", bad("port is not a number from 1 to 65535")
	}
	return net.JoinHostPort(host, strconv.Itoa(n)), nil
}

func isDNSName(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
		default:
			return false
		}
	}
	return true
}

// readState returns the valid servers of the state file at path; what it
// cannot use is logged.
func readState(path string, log *slog.Logger) []string {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		log.Warn("cannot read the apiserver load balancer's state file; using the configured servers only", "file", path, "err", err)
		return nil
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		log.Warn("apiserver load balancer's state file is not valid JSON; using the configured servers only (it is rewritten when the server list next changes)", "file", path, "err", err)
		return nil
	}
	var out []string
	for _, s := range st.Servers {
		c, err := canonical(s)
		if err != nil {
			log.Warn("ignoring an entry of the apiserver load balancer's state file", "file", path, "err", err)
			continue
		}
		out = append(out, c)
	}
	return out
}

// Addr is the address listened on, e.g. "127.0.0.1:6444".
func (lb *LB) Addr() string { return lb.ln.Addr().String() }

// URL is the apiserver URL for the node's clients: "https://" + Addr().
func (lb *LB) URL() string { return "https://" + lb.Addr() }

// Current is the server new connections go to.
func (lb *LB) Current() string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.cur
}

// Servers is the current list: the current server first, then the others
// in the order they are tried after it.
func (lb *LB) Servers() []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.serversLocked()
}

func (lb *LB) serversLocked() []string {
	i := slices.Index(lb.order, lb.cur)
	out := make([]string, 0, len(lb.order))
	out = append(out, lb.order[i:]...)
	return append(out, lb.order[:i]...)
}

// inBackoffLocked reports whether s failed less than retryAfter ago.
func (lb *LB) inBackoffLocked(s string, now time.Time) bool {
	until, ok := lb.failed[s]
	return ok && now.Before(until)
}

// Update replaces the list by servers, in order of preference. An empty
// list (or one without a valid host:port, each invalid entry is logged) is
// ignored: the balancer never forgets every server. The current server
// stays current when still listed; connections to servers no longer listed
// are closed, so their clients reconnect (and watch) through another. A
// changed list is logged and written to the StateFile.
func (lb *LB) Update(servers []string) {
	var order []string
	for _, s := range servers {
		c, err := canonical(s)
		if err != nil {
			lb.log.Warn("ignoring an apiserver address", "err", err)
			continue
		}
		if !slices.Contains(order, c) {
			order = append(order, c)
		}
	}
	lb.persistMu.Lock()
	defer lb.persistMu.Unlock()
	lb.mu.Lock()
	if len(order) == 0 {
		kept := lb.serversLocked()
		lb.mu.Unlock()
		lb.log.Warn("ignoring an empty apiserver list; keeping the known servers", "servers", kept)
		return
	}
	if slices.Equal(order, lb.order) {
		lb.mu.Unlock()
		return
	}
	var removed []string
	for _, s := range lb.order {
		if !slices.Contains(order, s) {
			removed = append(removed, s)
		}
	}
	lb.order = order
	prev := lb.cur
	if !slices.Contains(order, lb.cur) {
		lb.cur = order[0]
		now := lb.now()
		for _, s := range order {
			if !lb.inBackoffLocked(s, now) {
				lb.cur = s
				break
			}
		}
	}
	for s := range lb.failed {
		if !slices.Contains(order, s) {
			delete(lb.failed, s)
		}
	}
	var drop []*proxied
	for p := range lb.conns {
		if slices.Contains(removed, p.server) {
			drop = append(drop, p)
		}
	}
	list, cur := lb.serversLocked(), lb.cur
	lb.mu.Unlock()

	for _, p := range drop {
		p.close()
	}
	args := []any{"servers", list, "current", cur}
	if len(removed) > 0 {
		args = append(args, "removed", removed, "closedConnections", len(drop))
	}
	if cur != prev {
		args = append(args, "previous", prev)
	}
	lb.log.Info("apiserver list changed", args...)
	lb.persist(order)
}

func (lb *LB) persist(order []string) {
	if lb.stateFile == "" {
		return
	}
	data, err := json.MarshalIndent(state{Servers: order}, "", "  ")
	if err == nil {
		err = atomicfile.WriteFile(lb.stateFile, append(data, '\n'), 0o600)
	}
	if err != nil {
		lb.log.Warn("cannot save the apiserver list; after a restart only the configured servers are known until the list is followed again",
			"file", lb.stateFile, "err", err)
	}
}

// Run accepts connections and proxies each to a server until ctx ends;
// then it closes the listener and every proxied connection and returns nil
// once their goroutines are done. It returns an error if the listener
// fails otherwise, or if Run was called before. Without Run, connections
// wait in the listener's backlog.
func (lb *LB) Run(ctx context.Context) error {
	lb.mu.Lock()
	if lb.running {
		lb.mu.Unlock()
		return errors.New("apilb: Run called twice on one load balancer; make a new one with New")
	}
	lb.running = true
	lb.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { lb.ln.Close() })
	defer stop()
	lb.log.Info("apiserver load balancer listening", "addr", lb.Addr(), "servers", lb.Servers())

	var wg sync.WaitGroup
	var err error
	wait := backoff.Backoff{Initial: 5 * time.Millisecond, Max: time.Second}
	for {
		c, aerr := lb.ln.Accept()
		if aerr != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(aerr, net.ErrClosed) {
				err = fmt.Errorf("apilb: the listener on %s was closed while the load balancer ran: %w", lb.Addr(), aerr)
				break
			}
			// Out of file descriptors or memory: wait, as net/http does.
			d := wait.Next()
			lb.log.Warn("apiserver load balancer cannot accept a connection; retrying", "addr", lb.Addr(), "err", aerr, "in", d)
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
			continue
		}
		wait.Reset()
		wg.Go(func() { lb.handle(ctx, c) })
	}
	cancel()
	lb.ln.Close()
	lb.mu.Lock()
	lb.closed = true
	var open []*proxied
	for p := range lb.conns {
		open = append(open, p)
	}
	lb.mu.Unlock()
	for _, p := range open {
		p.close()
	}
	wg.Wait()
	return err
}

// handle proxies client to a server until either side ends.
func (lb *LB) handle(ctx context.Context, client net.Conn) {
	p, err := lb.connect(ctx, client)
	if err != nil {
		client.Close()
		return
	}
	defer lb.unregister(p)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The client half-closed (io.Copy saw EOF): pass that on and
		// keep relaying the answer. Anything else ends both sides.
		_, err := io.Copy(p.backend, p.client)
		if cw, ok := p.backend.(interface{ CloseWrite() error }); err == nil && ok {
			if cw.CloseWrite() == nil {
				return
			}
		}
		if timedOut(err) {
			lb.drop(p.server, err)
		}
		p.close()
	}()
	// The server ended (an apiserver never half-closes: its EOF ends the
	// connection) or died: close both, so the client reconnects.
	_, err = io.Copy(p.client, p.backend)
	if timedOut(err) {
		// The server stopped answering without closing (a machine gone, a
		// partition): its other connections are as dead, and new ones
		// must go elsewhere at once, not wait for a dial timeout.
		lb.drop(p.server, err)
	}
	p.close()
	<-done
}

// timedOut reports a connection the kernel gave up on: unacknowledged data
// past the user timeout, or keepalive probes unanswered.
func timedOut(err error) bool {
	var ne net.Error
	return err != nil && (errors.Is(err, syscall.ETIMEDOUT) || (errors.As(err, &ne) && ne.Timeout()))
}

// drop marks s failed and closes every connection proxied to it.
func (lb *LB) drop(s string, err error) {
	lb.markFailed(s, err)
	lb.mu.Lock()
	var dead []*proxied
	for p := range lb.conns {
		if p.server == s {
			dead = append(dead, p)
		}
	}
	lb.mu.Unlock()
	for _, p := range dead {
		p.close()
	}
	if len(dead) > 0 {
		lb.log.Warn("closed the connections to an apiserver that stopped answering; their clients reconnect through another", "server", s, "connections", len(dead))
	}
}

// Dead-peer detection on the connections to the servers: a server that
// vanishes without closing them (no FIN, no RST) is found within about
// deadAfter, whether a connection carries requests (unacknowledged data,
// TCP_USER_TIMEOUT where the OS has it) or waits on a watch (keepalive).
const deadAfter = 3 * time.Second

func watchDeath(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	_ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: deadAfter, Interval: time.Second, Count: 3})
	setUserTimeout(tc, deadAfter)
}

// connect dials a server for client, the current one first, trying each
// listed server at most once, and registers the proxied connection. It
// fails when none answers or Run ends.
func (lb *LB) connect(ctx context.Context, client net.Conn) (*proxied, error) {
	tried := map[string]bool{}
	var errs []error
	for {
		s := lb.pick(tried)
		if s == "" {
			break
		}
		tried[s] = true
		d := net.Dialer{Timeout: lb.dialTimeout}
		backend, err := d.DialContext(ctx, "tcp", s)
		if ctx.Err() != nil {
			if backend != nil {
				backend.Close()
			}
			return nil, ctx.Err()
		}
		if err != nil {
			lb.markFailed(s, err)
			errs = append(errs, err)
			continue
		}
		watchDeath(backend)
		p := &proxied{client: client, backend: backend, server: s}
		ok, err := lb.register(p)
		if err != nil {
			backend.Close()
			return nil, err
		}
		if ok {
			return p, nil
		}
		// s was removed by Update while we dialled: try another.
		backend.Close()
	}
	lb.mu.Lock()
	first := !lb.allDown
	lb.allDown = true
	servers := lb.serversLocked()
	lb.mu.Unlock()
	err := fmt.Errorf("apilb: no apiserver accepted a connection (tried %d): %w", len(errs), errors.Join(errs...))
	if first {
		lb.log.Error("no apiserver reachable; closing client connections until one is (check that the servers run and that this node reaches them)",
			"servers", servers, "err", err)
	}
	return nil, err
}

// pick returns the first listed server not in tried, the current one
// first, passing over those that failed recently unless only such remain;
// "" when every server was tried.
func (lb *LB) pick(tried map[string]bool) string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	now := lb.now()
	fallback := ""
	for _, s := range lb.serversLocked() {
		if tried[s] {
			continue
		}
		if lb.inBackoffLocked(s, now) {
			if fallback == "" {
				fallback = s
			}
			continue
		}
		return s
	}
	return fallback
}

// markFailed passes s over for retryAfter and, when s is current, makes the
// next server that has not failed recently current.
func (lb *LB) markFailed(s string, err error) {
	lb.mu.Lock()
	if !slices.Contains(lb.order, s) {
		lb.mu.Unlock()
		return
	}
	now := lb.now()
	_, already := lb.failed[s]
	lb.failed[s] = now.Add(lb.retryAfter)
	prev, next := lb.cur, ""
	if s == lb.cur {
		for _, o := range lb.serversLocked()[1:] {
			if !lb.inBackoffLocked(o, now) {
				next = o
				break
			}
		}
		if next != "" {
			lb.cur = next
		}
	}
	lb.mu.Unlock()
	if !already {
		lb.log.Warn("apiserver unreachable", "server", s, "err", err, "retryAfter", lb.retryAfter)
	}
	if next != "" {
		lb.log.Info("apiserver load balancer switched server", "from", prev, "to", next)
	}
}

// register records p, and makes p's server current when the current one
// has failed. It returns false if p's server is no longer listed, an error
// if Run has ended.
func (lb *LB) register(p *proxied) (bool, error) {
	lb.mu.Lock()
	if lb.closed {
		lb.mu.Unlock()
		return false, errors.New("apilb: the load balancer is stopping")
	}
	if !slices.Contains(lb.order, p.server) {
		lb.mu.Unlock()
		return false, nil
	}
	lb.conns[p] = struct{}{}
	_, wasFailed := lb.failed[p.server]
	delete(lb.failed, p.server)
	recovered := lb.allDown
	lb.allDown = false
	prev := lb.cur
	_, curFailed := lb.failed[lb.cur]
	if curFailed {
		lb.cur = p.server
	}
	lb.mu.Unlock()
	if wasFailed || recovered {
		lb.log.Info("apiserver reachable again", "server", p.server)
	}
	if curFailed {
		lb.log.Info("apiserver load balancer switched server", "from", prev, "to", p.server)
	}
	return true, nil
}

func (lb *LB) unregister(p *proxied) {
	lb.mu.Lock()
	delete(lb.conns, p)
	lb.mu.Unlock()
}

// open is the number of proxied connections, for tests.
func (lb *LB) open() int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return len(lb.conns)
}
