package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// udpFront is the UDP side of a frontend: the listening socket and a
// session per client address, each with its own connected socket to the
// endpoint chosen for that client, so replies find their way back.
type udpFront struct {
	f    *frontend
	conn *net.UDPConn

	mu       sync.Mutex
	sessions map[netip.AddrPort]*session
	closed   bool
}

type session struct {
	u      *udpFront
	client netip.AddrPort
	ep     netip.AddrPort
	conn   net.Conn
	last   atomic.Int64 // unix nanoseconds of the latest datagram either way
}

func newUDPFront(f *frontend, c *net.UDPConn) *udpFront {
	return &udpFront{f: f, conn: c, sessions: map[netip.AddrPort]*session{}}
}

// maxDatagram is the largest UDP payload over IPv4.
const maxDatagram = 65507

// serve reads client datagrams until the socket is closed.
func (u *udpFront) serve() {
	buf := make([]byte, maxDatagram+1)
	for {
		n, from, err := u.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a transient error concerns one datagram only
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		s := u.session(from)
		if s == nil {
			continue
		}
		s.touch()
		// A failed send (the endpoint went away) shows up as a read error
		// on the session, which then ends.
		_, _ = s.conn.Write(buf[:n])
	}
}

// session returns client's session, starting one when needed; nil when the
// datagram is to be dropped.
func (u *udpFront) session(client netip.AddrPort) *session {
	u.mu.Lock()
	s := u.sessions[client]
	u.mu.Unlock()
	if s != nil {
		return s
	}
	f := u.f
	if !f.allowed(client.Addr()) {
		return nil
	}
	var tried []netip.AddrPort
	for {
		ep, ok := f.pool.pick(client.Addr(), tried)
		if !ok {
			return nil
		}
		tried = append(tried, ep)
		ctx, cancel := context.WithTimeout(f.p.ctx, f.p.cfg.DialTimeout)
		c, err := f.p.cfg.Dial(ctx, "udp", ep.String())
		cancel()
		if err != nil {
			f.p.log.Debug("service proxy: endpoint failed", "address", f.key.String(), "endpoint", ep.String(), "err", err)
			continue
		}
		f.pool.settle(client.Addr(), ep)
		s = &session{u: u, client: client, ep: ep, conn: c}
		s.touch()
		u.mu.Lock()
		if u.closed {
			u.mu.Unlock()
			c.Close()
			return nil
		}
		u.sessions[client] = s
		u.mu.Unlock()
		f.p.wg.Go(s.serve)
		return s
	}
}

func (s *session) touch() { s.last.Store(time.Now().UnixNano()) }

// serve relays the endpoint's replies to the client until the session has
// been idle for the timeout, the endpoint refuses, or the session is
// closed.
func (s *session) serve() {
	defer s.end()
	idle := s.u.f.p.cfg.UDPIdleTimeout
	deliver := func(b []byte) {
		s.touch()
		_, _ = s.u.conn.WriteToUDPAddrPort(b, s.client)
	}
	for {
		deadline := time.Unix(0, s.last.Load()).Add(idle)
		if !time.Now().Before(deadline) {
			return
		}
		if err := s.conn.SetReadDeadline(deadline); err != nil {
			return
		}
		if err := readDatagram(s.conn, deliver); err != nil && !isTimeout(err) {
			return
		}
	}
}

// isTimeout reports whether err is a read deadline that passed.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// end removes the session (if it is still the registered one) and closes
// its socket.
func (s *session) end() {
	s.u.mu.Lock()
	if s.u.sessions[s.client] == s {
		delete(s.u.sessions, s.client)
	}
	s.u.mu.Unlock()
	s.conn.Close()
}

// dropSessionsNotIn ends the sessions whose endpoint is gone, as kube-proxy
// flushes their conntrack entries, so the clients' next datagrams go to a
// current endpoint.
func (u *udpFront) dropSessionsNotIn(eps []netip.AddrPort) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for c, s := range u.sessions {
		if !slices.Contains(eps, s.ep) {
			delete(u.sessions, c)
			s.conn.Close()
		}
	}
}

func (u *udpFront) close() {
	u.mu.Lock()
	u.closed = true
	for c, s := range u.sessions {
		delete(u.sessions, c)
		s.conn.Close()
	}
	u.mu.Unlock()
	u.conn.Close()
}

// bufs lends read buffers to UDP sessions only while a datagram is being
// read: an idle session, of which a DNS client makes one per query, holds
// no buffer.
var bufs = sync.Pool{New: func() any { b := make([]byte, maxDatagram+1); return &b }}

// readDatagramCopy is readDatagram for a conn without a descriptor: the
// buffer is held while waiting.
func readDatagramCopy(c net.Conn, deliver func([]byte)) error {
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	n, err := c.Read(*bp)
	if err != nil {
		return err
	}
	deliver((*bp)[:n])
	return nil
}
