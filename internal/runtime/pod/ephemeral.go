package pod

// Ephemeral containers (kubectl debug): how Update adds them to a pod
// without ever changing or removing one, the goroutine each runs once in,
// and the running target whose namespaces a debugger joins.

import (
	"fmt"
	"slices"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// startEphemeral starts the goroutine of every ephemeral container that has
// none yet. Each runs once, under restartPolicy Never whatever the pod's
// (the kubelet never restarts them); a re-attached one is waited for.
func (p *managedPod) startEphemeral() {
	p.m.mu.Lock()
	ctx := p.m.ctx
	p.m.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ephClosed || ctx == nil {
		return
	}
	for _, c := range p.ephemeral {
		if c.launched {
			continue
		}
		c.launched = true
		p.ephWG.Add(1)
		go func() {
			defer p.ephWG.Done()
			p.loop(ctx, c, runtimev1.RestartPolicy_RESTART_POLICY_NEVER)
		}()
	}
}

// targetProc is the running workload of an ephemeral container's target
// (kubectl debug --target).
type targetProc struct {
	sandboxed bool
	// Join names it for the debugger's init (sandboxed only); native: its
	// root is the host's view (`image: native`).
	join   sandbox.Join
	native bool
}

// target finds the running workload of ephemeral container c's target:
// the debugger joins its namespaces, as upstream's joins the target's.
func (p *managedPod) target(c *container) (targetProc, error) {
	notRunning := fmt.Errorf("target container %q is not running", c.target)
	p.mu.Lock()
	var t targetProc
	pid, dir := 0, ""
	for _, x := range append(append([]*container{}, p.init...), p.main...) {
		if x.name == c.target && x.proc != nil && x.state.Running != nil {
			pid, dir, t.sandboxed = x.proc.Pid(), x.stateDir, x.sandboxed
		}
	}
	p.mu.Unlock()
	if pid == 0 {
		return t, notRunning
	}
	if !t.sandboxed {
		return t, nil
	}
	// Its shim's record: the start time tells the process from a later
	// one given the same pid.
	att, err := sandbox.ReadAttempt(dir, true)
	if err != nil || att.Sandbox == nil || att.Pid != pid {
		return t, notRunning
	}
	t.join = sandbox.Join{Pid: pid, StartTicks: att.StartTicks}
	t.native = att.Sandbox.Lower == ""
	return t, nil
}

// newEphemeral is an ephemeral container: it stops when the pod is deleted
// or its worker finished (see run).
func (p *managedPod) newEphemeral(ec *runtimev1.EphemeralContainerSpec) *container {
	c := p.m.newContainer(ec.GetContainer(), false, p.ephStop)
	c.ephemeral, c.target = true, ec.GetTargetContainerName()
	return c
}

// mergeEphemeralLocked adds the ephemeral containers spec names for the
// first time. Ephemeral containers cannot change or be removed (the API
// refuses both): a known one keeps its spec, and one missing from spec is
// kept in it, so pod.json always describes every container that ran.
// Caller holds p.mu.
func (p *managedPod) mergeEphemeralLocked(spec *runtimev1.PodSpec) (added bool) {
	known := map[string]*container{}
	for _, c := range p.ephemeral {
		known[c.name] = c
	}
	listed := map[string]bool{}
	for i, ec := range spec.GetEphemeralContainers() {
		name := ec.GetContainer().GetName()
		listed[name] = true
		if c, ok := known[name]; ok {
			spec.EphemeralContainers[i] = &runtimev1.EphemeralContainerSpec{Container: c.spec, TargetContainerName: c.target}
			continue
		}
		p.ephemeral = append(p.ephemeral, p.newEphemeral(ec))
		added = true
	}
	for _, c := range p.ephemeral {
		if !listed[c.name] {
			spec.EphemeralContainers = append(spec.EphemeralContainers, &runtimev1.EphemeralContainerSpec{Container: c.spec, TargetContainerName: c.target})
		}
	}
	// Keep the order the containers were added in.
	order := map[string]int{}
	for i, c := range p.ephemeral {
		order[c.name] = i
	}
	slices.SortStableFunc(spec.EphemeralContainers, func(a, b *runtimev1.EphemeralContainerSpec) int {
		return order[a.GetContainer().GetName()] - order[b.GetContainer().GetName()]
	})
	return added
}
