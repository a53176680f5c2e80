package pod

// The pod's worker: the order its containers run in (init containers,
// sidecars, then the main containers) and each container's restart loop
// under its policy.

import (
	"context"
	"sync"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

type outcome int

const (
	outExited   outcome = iota // the attempt ended; the caller applies the restart policy
	outRestart                 // the definition changed: start again without back-off
	outStopped                 // the pod is being deleted
	outDetached                // the daemon is stopping; containers keep running
)

const (
	normal  = runtimev1.EventType_EVENT_TYPE_NORMAL
	warning = runtimev1.EventType_EVENT_TYPE_WARNING
)

// run is the pod's worker: init containers in order (a native sidecar
// starts and the next init container follows once it is started), then
// every container in parallel, each under the restart policy. Sidecars stop
// after the main containers, in reverse order.
func (p *managedPod) run(ctx context.Context) {
	defer close(p.done)
	// Ephemeral containers run beside all this and stop when the pod is
	// deleted or once the worker is done (the pod is terminal); when the
	// daemon stops they detach, as every container does.
	finished := make(chan struct{})
	go func() {
		select {
		case <-p.deleteCh:
		case <-finished:
			if ctx.Err() != nil {
				return
			}
		case <-ctx.Done():
			return
		}
		p.ephStopOnce.Do(func() { close(p.ephStop) })
	}()
	defer func() {
		p.mu.Lock()
		p.ephClosed = true
		p.mu.Unlock()
		close(finished)
		p.ephWG.Wait()
	}()
	// The network is set up beside the first container's image and its
	// ContainerCreating record (runOnce waits for it before the start);
	// the worker ends after it, so a deleted pod's address is released.
	go p.setUpNetwork(ctx)
	defer func() { <-p.netReady }()
	p.mu.Lock()
	policy := p.spec.GetRestartPolicy()
	p.mu.Unlock()
	type running struct {
		c    *container
		done chan struct{}
	}
	var sidecars []running
	defer func() {
		for i := len(sidecars) - 1; i >= 0; i-- {
			if ctx.Err() == nil {
				close(sidecars[i].c.stopc)
			}
			<-sidecars[i].done
		}
	}()
	for _, c := range p.init {
		if c.sidecar() {
			done := make(chan struct{})
			go func() {
				defer close(done)
				p.loop(ctx, c, runtimev1.RestartPolicy_RESTART_POLICY_ALWAYS)
			}()
			sidecars = append(sidecars, running{c, done})
			if !p.waitStarted(ctx, c, done) {
				return
			}
			continue
		}
		if c.succeeded() {
			continue
		}
		for {
			out := p.runOnce(ctx, c)
			if out == outStopped || out == outDetached {
				return
			}
			if out == outRestart {
				continue
			}
			p.mu.Lock()
			ok := c.succeeded()
			p.mu.Unlock()
			if ok {
				break
			}
			if policy == runtimev1.RestartPolicy_RESTART_POLICY_NEVER {
				return // the pod failed
			}
			if !p.backoff(ctx, c) {
				return
			}
		}
	}
	var wg sync.WaitGroup
	for _, c := range p.main {
		wg.Add(1)
		go func(c *container) {
			defer wg.Done()
			p.loop(ctx, c, policy)
		}(c)
	}
	wg.Wait()
}

// setUpNetwork gives the pod its network (unless it is being deleted
// already), then closes netReady.
func (p *managedPod) setUpNetwork(ctx context.Context) {
	up := false
	select {
	case <-p.deleteCh:
	default:
		up = p.ensureNetwork(ctx)
	}
	p.mu.Lock()
	p.netUp = up
	p.mu.Unlock()
	close(p.netReady)
}

// loop runs c's attempts under policy until it stops for good.
func (p *managedPod) loop(ctx context.Context, c *container, policy runtimev1.RestartPolicy) {
	for {
		out := p.runOnce(ctx, c)
		if out == outStopped || out == outDetached {
			return
		}
		if out == outRestart {
			continue
		}
		p.mu.Lock()
		code := c.state.Terminated.ExitCode
		p.mu.Unlock()
		if !shouldRestart(policy, code) {
			return
		}
		if !p.backoff(ctx, c) {
			return
		}
	}
}

// waitStarted waits until the sidecar c is started (running, postStart
// done, startup probe passed). False means the pod stops or the daemon
// detaches.
func (p *managedPod) waitStarted(ctx context.Context, c *container, done chan struct{}) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		p.mu.Lock()
		ok := c.state.Running != nil && c.probeStarted
		p.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-t.C:
		case <-done:
			return false
		case <-p.deleteCh:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// sleep waits d; it returns the reason it was cut short, if it was.
func (p *managedPod) sleep(ctx context.Context, c *container, d time.Duration) (outcome, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return 0, true
	case <-c.stopc:
		return outStopped, false
	case <-ctx.Done():
		return outDetached, false
	case <-c.wake:
		return outRestart, false
	}
}
