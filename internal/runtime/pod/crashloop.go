package pod

// CrashLoopBackOff: the wait between a failed container's restarts, and
// when the back-off starts over.

import (
	"context"
	"fmt"
	"time"
)

// backoff applies CrashLoopBackOff before a restart: the first restart is
// immediate, later ones wait base, 2*base ... up to max after the previous
// attempt finished; a container that ran for BackOffResetAfter starts over.
func (p *managedPod) backoff(ctx context.Context, c *container) bool {
	cfg := p.m.cfg
	p.mu.Lock()
	t := c.state.Terminated
	if t.FinishedAt.Sub(t.StartedAt) >= cfg.BackOffResetAfter {
		c.crashBackOff.Reset()
	}
	d := c.crashBackOff.Delay() // 0 for the first restart
	c.crashBackOff.Next()
	wait := d - time.Since(t.FinishedAt)
	c.last = t
	msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", d, c.name, p.name, p.namespace, p.uid)
	if wait > 0 {
		c.state = containerState{Waiting: &waiting{Reason: "CrashLoopBackOff", Message: msg}}
	} else {
		c.state = containerState{Waiting: &waiting{Reason: "ContainerCreating"}}
	}
	p.mu.Unlock()
	p.changedNotify()
	if wait <= 0 {
		return true
	}
	p.event(warning, "BackOff", c.name, fmt.Sprintf("Back-off restarting failed container %s in pod %s_%s(%s)", c.name, p.name, p.namespace, p.uid))
	out, ok := p.sleep(ctx, c, wait)
	return ok || out == outRestart
}
