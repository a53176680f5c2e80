package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/backoff"
)

// accept serves ln until it is closed.
func (f *frontend) accept(ln *net.TCPListener) {
	// Out of descriptors or the like: back off instead of spinning, as
	// net/http does (5 ms doubling to 1 s, from 5 ms again once one is
	// accepted).
	delay := backoff.Backoff{Initial: 5 * time.Millisecond, Max: time.Second}
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			f.p.log.Warn("service proxy: accept", "address", f.key.String(), "err", err)
			time.Sleep(delay.Next())
			continue
		}
		delay.Reset()
		f.p.wg.Go(func() { f.serveTCP(c) })
	}
}

// serveTCP connects c to an endpoint and relays until both sides are done.
// An endpoint that refuses or does not answer in time is skipped for the
// next, each tried at most once.
func (f *frontend) serveTCP(c *net.TCPConn) {
	client := addrOf(c.RemoteAddr())
	if !f.allowed(client) {
		reset(c)
		return
	}
	var tried []netip.AddrPort
	for {
		ep, ok := f.pool.pick(client, tried)
		if !ok {
			// Every endpoint failed: a reset is what the client would have
			// got from the endpoint itself through kube-proxy's NAT.
			f.p.log.Debug("service proxy: no endpoint answered", "address", f.key.String(), "tried", tried)
			reset(c)
			return
		}
		tried = append(tried, ep)
		ctx, cancel := context.WithTimeout(f.p.ctx, f.p.cfg.DialTimeout)
		up, err := f.p.cfg.Dial(ctx, "tcp", ep.String())
		cancel()
		if err != nil {
			f.p.log.Debug("service proxy: endpoint failed", "address", f.key.String(), "endpoint", ep.String(), "err", err)
			continue
		}
		f.pool.settle(client, ep)
		f.p.relay(c, up)
		return
	}
}

// relay copies both ways between client and backend. The conns are passed
// to io.Copy as they are: with *net.TCPConn on both sides Go moves the
// bytes with splice(2), never through user space. When one side ends its
// stream the other is half-closed; when a side fails both are closed.
func (p *Proxy) relay(client *net.TCPConn, backend net.Conn) {
	if !p.conns.add(client, backend) {
		client.Close()
		backend.Close()
		return
	}
	defer p.conns.remove(client)
	if p.onRelay != nil {
		p.onRelay(client, backend)
	}
	var up sync.WaitGroup
	up.Go(func() { pipe(backend, client) })
	pipe(client, backend)
	up.Wait()
	client.Close()
	backend.Close()
}

// pipe copies src to dst until src ends.
func pipe(dst, src net.Conn) {
	if _, err := io.Copy(dst, src); err != nil {
		// A reset (either side) or shutdown: pass the abort on to both
		// rather than a clean end of stream, which also ends the other
		// direction.
		reset(dst)
		reset(src)
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	dst.Close()
}

// reset closes c so that its peer sees a reset (RST), not an end of stream.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// connSet holds the relayed connections so that Run can end them.
type connSet struct {
	mu     sync.Mutex
	m      map[*net.TCPConn]net.Conn
	closed bool
}

// add registers a relay; false once the proxy is shutting down.
func (s *connSet) add(client *net.TCPConn, backend net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.m == nil {
		s.m = map[*net.TCPConn]net.Conn{}
	}
	s.m[client] = backend
	return true
}

func (s *connSet) remove(client *net.TCPConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, client)
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c, b := range s.m {
		c.Close()
		b.Close()
	}
}
