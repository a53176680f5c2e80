package pod

// Stopping a running attempt: preStop hook, SIGTERM, grace period,
// SIGKILL.

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
)

// minimumGracePeriod is what a container gets after a preStop hook used
// up its grace period (the kubelet's minimumGracePeriodInSeconds).
const minimumGracePeriod = 2 * time.Second

// stop ends a running attempt: the preStop hook (counted against the grace
// period), SIGTERM to its process group, the rest of the grace period, then
// SIGKILL to the group. The shim holds the SIGKILL deadline (Stopper), so
// it holds when the daemon stops meanwhile: stop then returns at once,
// reporting detached, and the next daemon sees the attempt end.
func (p *managedPod) stop(ctx context.Context, c *container, proc Process, ch chan waitResult, msg string) (detached bool) {
	p.mu.Lock()
	grace := p.grace
	if p.terminating && c.sidecar() && grace > 0 {
		// Sidecars stop after the main containers, within what is left of
		// the pod's grace period (at least the kubelet's minimum).
		grace = max(time.Until(p.graceEnd), minimumGracePeriod)
	}
	if !p.terminating && p.evicted == "" {
		grace = 30 * time.Second
		if p.spec.TerminationGracePeriodSeconds != nil {
			grace = time.Duration(p.spec.GetTerminationGracePeriodSeconds()) * time.Second
		}
	}
	preStop := c.spec.GetLifecycle().GetPreStop()
	p.mu.Unlock()
	stopper, _ := proc.(Stopper)
	signal := func(sig syscall.Signal, killAfter time.Duration) {
		var err error
		switch {
		case stopper != nil:
			err = stopper.Stop(sig, killAfter)
		case sig != 0:
			err = proc.Signal(sig)
		}
		if err != nil && !errors.Is(err, os.ErrProcessDone) {
			p.m.log.Warn("signal container", "pod", p.key(), "container", c.name, "err", err)
		}
	}
	p.event(normal, "Killing", c.name, msg)
	if preStop != nil && grace > 0 {
		// The deadline first: the hook counts against the grace period.
		signal(0, grace)
		start := time.Now()
		hctx, cancel := context.WithTimeout(context.Background(), grace)
		errc := make(chan error, 1)
		go func() { errc <- p.runHook(hctx, c, preStop) }()
		select {
		case err := <-errc:
			if err != nil {
				p.event(warning, "FailedPreStopHook", c.name, err.Error())
			}
		case <-hctx.Done():
			p.m.log.Info("preStop hook did not finish within the grace period", "pod", p.key(), "container", c.name, "grace", grace)
		case r := <-ch:
			cancel()
			p.recordExit(c, r)
			return false
		case <-ctx.Done():
			cancel()
			return true
		}
		cancel()
		grace = max(grace-time.Since(start), minimumGracePeriod)
	}
	sig := syscall.SIGTERM
	if grace <= 0 {
		sig = syscall.SIGKILL
	}
	signal(sig, grace)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case r := <-ch:
		p.recordExit(c, r)
		return false
	case <-t.C:
	case <-ctx.Done():
		return true
	}
	proc.Signal(syscall.SIGKILL)
	select {
	case r := <-ch:
		p.recordExit(c, r)
	case <-time.After(30 * time.Second):
		p.recordExit(c, waitResult{err: errors.New("the container did not exit after SIGKILL")})
	case <-ctx.Done():
		return true
	}
	return false
}
