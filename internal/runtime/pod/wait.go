package pod

// A running attempt: waiting for its end while its postStart hook and
// probes run, and recording how it ended.

import (
	"context"
	"fmt"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

type waitResult struct {
	es  ExitStatus
	err error
}

// waitProc waits for the running attempt to end, stopping it on delete,
// definition change, a failed postStart hook or a failed startup/liveness
// probe, or detaching when the daemon stops. fresh is a just-started
// attempt, whose postStart hook runs first.
func (p *managedPod) waitProc(ctx context.Context, c *container, fresh bool) outcome {
	p.mu.Lock()
	proc := c.proc
	cspec := c.spec
	restart := c.sidecar() || p.spec.GetRestartPolicy() != runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	p.mu.Unlock()
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan waitResult, 1)
	go func() {
		es, err := proc.Wait(wctx)
		ch <- waitResult{es, err}
	}()
	// Hooks and probes of this attempt end with it.
	hctx, hcancel := context.WithCancel(context.Background())
	defer hcancel()
	hookDone := make(chan error, 1)
	if h := cspec.GetLifecycle().GetPostStart(); fresh && h != nil {
		go func() { hookDone <- p.runHook(hctx, c, h) }()
	} else {
		hookDone <- nil
	}
	kill := make(chan string, 1)
	if !fresh {
		go p.checkNetNS(hctx, c, proc, kill)
	}
	for {
		select {
		case r := <-ch:
			hcancel()
			p.recordExit(c, r)
			return outExited
		case err := <-hookDone:
			hookDone = nil
			if err != nil {
				hcancel()
				p.event(warning, "FailedPostStartHook", c.name, err.Error())
				if p.stop(ctx, c, proc, ch, "FailedPostStartHook") {
					return outDetached
				}
				return outExited
			}
			p.mu.Lock()
			changed := c.state.Running == nil || (cspec.GetStartupProbe() == nil && !c.probeStarted)
			if c.state.Running == nil {
				c.state = containerState{Running: &running{StartedAt: proc.StartedAt()}}
			}
			c.startedWithoutProbe(cspec)
			p.mu.Unlock()
			if changed {
				p.changedNotify()
			}
			go p.probe(hctx, c, cspec, proc.StartedAt(), restart, kill)
		case msg := <-kill:
			hcancel()
			if p.stop(ctx, c, proc, ch, msg) {
				return outDetached
			}
			return outExited
		case <-c.stopc:
			hcancel()
			if p.stop(ctx, c, proc, ch, "Stopping container "+c.name) {
				return outDetached
			}
			return outStopped
		case <-c.wake:
			hcancel()
			if p.stop(ctx, c, proc, ch, fmt.Sprintf("Container %s definition changed, will be restarted", c.name)) {
				return outDetached
			}
			p.update(func() {
				c.last = c.state.Terminated
				c.state = containerState{Waiting: &waiting{Reason: "ContainerCreating"}}
				c.changed = true
			})
			return outRestart
		case <-ctx.Done():
			hcancel()
			cancel()
			<-ch
			return outDetached
		}
	}
}

func (p *managedPod) recordExit(c *container, r waitResult) {
	var msg string
	if r.err == nil && !r.es.Unknown {
		msg = p.terminationMessage(c, r.es.ExitCode)
	}
	p.update(func() {
		es := r.es
		t := &terminated{ExitCode: es.ExitCode, Signal: es.Signal, StartedAt: es.StartedAt, FinishedAt: es.FinishedAt, ContainerID: c.containerID, Message: es.Message}
		if t.Message == "" {
			t.Message = msg
		}
		switch {
		case r.err != nil:
			t.ExitCode, t.Reason, t.Message, t.FinishedAt = 255, "ExitStatusUnknown", r.err.Error(), time.Now()
		case es.Unknown:
			t.Reason = "ExitStatusUnknown"
		case es.ExitCode == 0:
			t.Reason = "Completed"
		default:
			t.Reason = "Error"
		}
		if t.StartedAt.IsZero() && c.state.Running != nil {
			t.StartedAt = c.state.Running.StartedAt
		}
		p.noteOOM(c, t)
		c.state = containerState{Terminated: t}
		c.proc = nil
	})
}
