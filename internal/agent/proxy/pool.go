package proxy

import (
	"net/netip"
	"slices"
	"sync"
	"time"
)

// pool balances one frontend's connections over its endpoints: round robin,
// or ClientIP affinity when the Service asks for it. It is safe for
// concurrent use; the accept loops pick while the worker updates.
type pool struct {
	mu        sync.Mutex
	eps       []netip.AddrPort
	next      int
	timeout   time.Duration // affinity; 0: none
	sticky    map[netip.Addr]stick
	lastSweep time.Time
	now       func() time.Time // tests move the clock
}

type stick struct {
	ep    netip.AddrPort
	until time.Time
}

func newPool() *pool { return &pool{now: time.Now} }

// set replaces the endpoints. Affinity entries for endpoints that are gone
// are dropped, so those clients are balanced afresh.
func (p *pool) set(eps []netip.AddrPort, timeout time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.eps = eps
	if len(eps) > 0 {
		p.next %= len(eps)
	} else {
		p.next = 0
	}
	if timeout != p.timeout {
		p.timeout, p.sticky = timeout, nil
	}
	for c, s := range p.sticky {
		if !slices.Contains(eps, s.ep) {
			delete(p.sticky, c)
		}
	}
}

func (p *pool) endpoints() []netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.eps
}

// pick returns the endpoint for a new connection from client, skipping the
// ones already tried for it; false when none is left.
func (p *pool) pick(client netip.Addr, tried []netip.AddrPort) (netip.AddrPort, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timeout > 0 {
		if s, ok := p.sticky[client]; ok && p.now().Before(s.until) && !slices.Contains(tried, s.ep) {
			return s.ep, true
		}
	}
	n := len(p.eps)
	for i := range n {
		j := (p.next + i) % n
		if ep := p.eps[j]; !slices.Contains(tried, ep) {
			p.next = (j + 1) % n
			return ep, true
		}
	}
	return netip.AddrPort{}, false
}

// settle records that client's connection went to ep, starting (or
// extending) its affinity: like kube-proxy's, the timeout counts from the
// client's latest connection.
func (p *pool) settle(client netip.Addr, ep netip.AddrPort) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timeout <= 0 || !slices.Contains(p.eps, ep) {
		return
	}
	now := p.now()
	if p.sticky == nil {
		p.sticky = map[netip.Addr]stick{}
	}
	p.sticky[client] = stick{ep: ep, until: now.Add(p.timeout)}
	// Sweep expired entries now and then instead of running a timer.
	if now.Sub(p.lastSweep) > min(p.timeout, time.Minute) {
		p.lastSweep = now
		for c, s := range p.sticky {
			if !now.Before(s.until) {
				delete(p.sticky, c)
			}
		}
	}
}
