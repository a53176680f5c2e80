package pod

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/clone"
	"github.com/k3sm-dev/k3sm/internal/runtime/criolog"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
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

// backoff applies CrashLoopBackOff before a restart: the first restart is
// immediate, later ones wait base, 2*base ... up to max after the previous
// attempt finished; a container that ran for BackOffResetAfter starts over.
func (p *managedPod) backoff(ctx context.Context, c *container) bool {
	cfg := p.m.cfg
	p.mu.Lock()
	t := c.state.Terminated
	if t.FinishedAt.Sub(t.StartedAt) >= cfg.BackOffResetAfter {
		c.crashDelay = 0
	}
	var d time.Duration
	if c.crashDelay == 0 {
		c.crashDelay = cfg.CrashLoopBackOffBase
	} else {
		d = c.crashDelay
		c.crashDelay = min(2*c.crashDelay, cfg.CrashLoopBackOffMax)
	}
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

// runOnce runs one attempt of c: waits for an attached process, reports a
// recorded termination, or pulls, prepares and starts a new attempt.
func (p *managedPod) runOnce(ctx context.Context, c *container) outcome {
	p.mu.Lock()
	if c.proc != nil {
		p.mu.Unlock()
		return p.waitProc(ctx, c, false)
	}
	if c.state.Terminated != nil && !c.changed {
		p.mu.Unlock()
		return outExited
	}
	if p.terminating && !c.sidecar() {
		p.mu.Unlock()
		return outStopped
	}
	select {
	case <-c.stopc:
		p.mu.Unlock()
		return outStopped
	default:
	}
	c.changed = false
	p.mu.Unlock()
	if ctx.Err() != nil {
		return outDetached
	}

	img, usedRef, out, ok := p.ensureImage(ctx, c)
	if !ok {
		return out
	}

	p.mu.Lock()
	// A definition change that arrived during the pull is already in
	// c.spec; start with it (and pull again if the image changed).
	select {
	case <-c.wake:
	default:
	}
	if c.spec.GetImage() != usedRef {
		p.mu.Unlock()
		return outRestart
	}
	c.changed = false
	// An attempt that never started its process (the daemon died while
	// starting it) is made again under its number: the kubelet counts
	// restarts of containers that ran.
	redo := c.unstarted
	if c.hasRun && !redo {
		c.restartCount++
	}
	c.hasRun, c.unstarted = true, false
	n := c.restartCount
	name := c.name
	attempt := fmt.Sprintf("%s/%s/%d", p.uid, name, n)
	sum := sha256.Sum256([]byte(attempt))
	c.containerID = "k3sm://" + hex.EncodeToString(sum[:])
	c.stateDir = p.m.dirs().PodAttemptDir(p.uid, name, int(n))
	c.state = containerState{Waiting: &waiting{Reason: "ContainerCreating"}}
	// Whether this attempt runs in the sandbox (probes and exec enter it),
	// recorded with this update rather than one more before the start.
	boxed := !p.m.cfg.DisableSandbox && sandboxed()
	c.sandboxed = boxed
	if img != nil {
		c.imageID, c.imageDigest = repoDigestFor(img, c.spec.GetImage()), img.ID
	}
	if c.envPending {
		p.applyNextEnv(c)
	}
	spec := p.spec
	cspec := c.spec
	root := p.rootDir(c)
	rootImage := c.rootImage
	p.mu.Unlock()
	p.changedNotify()

	if redo {
		// What the unstarted attempt left (a config, a shim log).
		os.RemoveAll(p.m.dirs().PodAttemptDir(p.uid, name, int(n)))
	}
	// Older attempts than the previous one are not needed (kubelet keeps
	// the previous log for --previous).
	if n >= 2 {
		os.RemoveAll(p.m.dirs().PodAttemptDir(p.uid, name, int(n-2)))
		criolog.RemoveAll(filepath.Join(p.logDir(), name, strconv.Itoa(int(n-2))+".log"))
	}

	fail := func(msg string) outcome {
		now := time.Now()
		p.update(func() {
			c.state = containerState{Terminated: &terminated{ExitCode: 128, Reason: "StartError", Message: msg, StartedAt: now, FinishedAt: now, ContainerID: c.containerID}}
		})
		p.event(warning, "Failed", name, "Error: "+msg)
		return outExited
	}

	// Starting is disk- and fork-bound: a few at a time finish in arrival
	// order, where a burst started all at once would finish all at the end.
	select {
	case p.m.startSlots <- struct{}{}:
	case <-c.stopc:
		return outStopped
	case <-ctx.Done():
		return outDetached
	}
	release := sync.OnceFunc(func() { <-p.m.startSlots })
	defer release()

	// In the sandbox the image is the container's "/" (an overlay: nothing
	// is copied; each attempt starts from the image, as a new container
	// does). Otherwise the container's root is a copy-on-write clone of
	// the image, kept across restarts of the same image.
	if boxed {
		if msg := refusal(spec, cspec); msg != "" {
			return p.refuse(ctx, c, msg)
		}
	}
	var box sandboxInput
	if boxed {
		id, err := containerIdentity(spec, cspec, img)
		if err != nil {
			return p.refuse(ctx, c, err.Error())
		}
		base, err := p.idRangeBase()
		if err != nil {
			return fail(err.Error())
		}
		if img == nil {
			// The native container's private directory (at nativeRoot
			// in the sandbox), its own: kept across restarts, as before.
			if err := os.MkdirAll(root, 0o700); err != nil {
				return fail(err.Error())
			}
			if sandbox.Rootless() {
				// Already the pod root's: the runtime's own.
			} else if err := os.Chown(root, int(base), int(base)); err != nil {
				return fail(err.Error())
			}
			os.Chmod(root, 0o777|os.ModeSticky)
		} else {
			os.RemoveAll(root)
			if err := os.MkdirAll(root, 0o700); err != nil {
				return fail(err.Error())
			}
		}
		box = sandboxInput{Pod: spec, Container: cspec, PodDir: p.dir, Root: root, Native: img == nil, Image: img, IDBase: base,
			Upper: filepath.Join(root, "upper"), Work: filepath.Join(root, "work"), Hostname: podHostname(spec), Identity: id,
			SeccompDir: p.m.dirs().SeccompDir()}
	} else if img == nil {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return fail(err.Error())
		}
	} else if rootImage != img.ID {
		os.RemoveAll(root)
		os.MkdirAll(filepath.Dir(root), 0o700)
		if _, err := clone.Tree(img.RootFS, root); err != nil {
			return fail("materialize pod root: " + err.Error())
		}
		p.update(func() { c.rootImage = img.ID })
	}

	resolveRoot := root
	if boxed && img == nil {
		resolveRoot = nativeRoot
	}
	res, err := resolveProcess(spec, cspec, img, resolveRoot, boxed)
	if err != nil {
		return fail(err.Error())
	}
	if boxed && !hasEnv(res.Env, "HOME") {
		res.Env = append(res.Env, "HOME="+box.Identity.Home)
	}
	// kubectl debug --target: the debugger is a container of its own (its
	// image as "/", its volume mounts) in the target's user, pid, UTS and
	// IPC namespaces. Outside the sandbox there are none to join: it sees
	// the target's processes as the node does.
	var join *sandbox.Join
	keepLandlock := true
	if c.target != "" {
		t, err := p.target(c)
		if err != nil {
			return fail(err.Error())
		}
		if boxed {
			if !t.sandboxed {
				return fail(fmt.Sprintf("target container %q runs outside the sandbox (started before it was enabled): its namespaces cannot be joined; restart the pod", c.target))
			}
			join = &t.join
			// Landlock lets a process reach /proc/<pid>/root only of
			// processes in its own domain, which a debugger, started after
			// the target, cannot share. With both roots images, the
			// debugger goes without: through the target's root it reaches
			// what the target reaches, under the target's mount flags.
			// Either on the host's view keeps it: that view is bounded by
			// Landlock alone.
			keepLandlock = img == nil || t.native
		}
	}
	ms, err := p.containerMounts(cspec, root, res.Env)
	if err != nil {
		return fail(err.Error())
	}
	m, env, err := p.resolvConf(spec)
	if err != nil {
		return fail(err.Error())
	}
	if m != nil {
		ms = append(ms, *m) // last: over whatever a volume put at /etc
	}
	res.Env = append(res.Env, env...)
	if boxed {
		// The volumes exist now (containerMounts sets them up).
		if err := p.ownVolumes(spec); err != nil {
			return fail(err.Error())
		}
	}
	cgs, err := p.containerCgroups(spec, c, cspec)
	if err != nil {
		return fail(err.Error())
	}

	// The pod's network (set up since CreatePod, while the image was
	// checked and all of the above was prepared): what is left needs its
	// address and namespaces.
	select {
	case <-p.netReady:
	case <-c.stopc:
		return outStopped
	case <-ctx.Done():
		return outDetached
	}
	p.mu.Lock()
	up := p.netUp
	netns, userns, podIP := p.net.NetNS, p.net.UserNS, p.net.IP
	p.mu.Unlock()
	if !up {
		// Deleted, or the daemon stops (the attempt never started: a
		// restarted daemon makes it again under its number).
		if ctx.Err() != nil {
			return outDetached
		}
		return outStopped
	}

	res.fillPodIP(podIP)
	if join != nil && sandbox.Rootless() && userns == "" {
		// A rootless shim cannot join a user namespace: it starts in the
		// target's (each container has its own without a pod network),
		// where it is root. The shim checks it is the target's.
		userns = fmt.Sprintf("/proc/%d/ns/user", join.Pid)
	}
	var sb *sandbox.Spec
	if boxed {
		box.PodUserNS = userns
		etc, err := p.etcFiles(box.Hostname, podIP, ms)
		if err != nil {
			return fail(err.Error())
		}
		ms = append(ms, etc...)
		if img == nil {
			ms = append(ms, mounts.Mount{Source: root, Target: nativeRoot})
		}
		box.addMounts(ms)
		if sb, err = buildSandbox(box); err != nil {
			return p.refuse(ctx, c, err.Error())
		}
		if sandbox.Rootless() {
			sb.Own = p.rootlessOwners(spec)
		}
		sb.Join = join
		if !keepLandlock {
			sb.Landlock = nil
		}
	}
	if !boxed {
		// Where the boundary is a wrapper (darwin's Seatbelt).
		in := sandboxInput{Pod: spec, Container: cspec, PodDir: p.dir, Root: root, Native: img == nil}
		in.addMounts(ms)
		if sb, err = wrapperSandbox(in); err != nil {
			return p.refuse(ctx, c, err.Error())
		}
	}
	proc, err := p.m.cfg.Starter.Start(ctx, ProcessSpec{ID: attempt, Argv: res.Argv, Env: res.Env, Dir: res.Dir,
		LogPath:    filepath.Join(p.logDir(), name, strconv.Itoa(int(n))+".log"),
		LogMaxSize: p.m.cfg.ContainerLogMaxSize, LogMaxFiles: p.m.cfg.ContainerLogMaxFiles, StateDir: c.stateDir,
		Stdin: cspec.GetStdin(), StdinOnce: cspec.GetStdinOnce(), TTY: cspec.GetTty(), Mounts: ms, NetNS: netns, UserNS: userns, Sandbox: sb, Cgroups: cgs})
	release()
	if err != nil {
		return fail(err.Error())
	}
	p.update(func() {
		c.proc = proc
		c.probeStarted, c.probeReady = false, false
		// With a postStart hook the container is not Running until the
		// hook completed (the kubelet reports it once startContainer
		// returned).
		if cspec.GetLifecycle().GetPostStart() == nil {
			c.state = containerState{Running: &running{StartedAt: proc.StartedAt()}}
			c.startedWithoutProbe(cspec)
		}
	})
	p.event(normal, "Created", name, "Created container "+name)
	p.event(normal, "Started", name, "Started container "+name)
	return p.waitProc(ctx, c, true)
}

// repoDigestFor picks the image's repo digest for the reference the pod
// used (kubelet's imageID), falling back to the image id.
func repoDigestFor(img *image.Image, ref string) string {
	if r, err := image.ParseRef(ref); err == nil {
		repo := r.Context().Name()
		for _, d := range img.RepoDigests {
			if len(d) > len(repo) && d[:len(repo)] == repo && d[len(repo)] == '@' {
				return d
			}
		}
	}
	if len(img.RepoDigests) > 0 {
		return img.RepoDigests[0]
	}
	return img.ID
}

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

func (p *managedPod) recordExit(c *container, r waitResult) {
	p.update(func() {
		es := r.es
		t := &terminated{ExitCode: es.ExitCode, Signal: es.Signal, StartedAt: es.StartedAt, FinishedAt: es.FinishedAt, ContainerID: c.containerID, Message: es.Message}
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

// ensureImage applies the pull policy, retrying failed pulls with
// ImagePullBackOff. It returns nil for image "native".
func (p *managedPod) ensureImage(ctx context.Context, c *container) (*image.Image, string, outcome, bool) {
	p.mu.Lock()
	ref := c.spec.GetImage()
	policy := c.spec.GetImagePullPolicy()
	secrets := p.spec.GetPullSecrets()
	name := c.name
	p.mu.Unlock()
	if ref == NativeImage {
		return nil, ref, 0, true
	}
	setWaiting := func(reason, msg string) {
		p.update(func() { c.state = containerState{Waiting: &waiting{Reason: reason, Message: msg}} })
	}
	if _, err := image.ParseRef(ref); err != nil {
		msg := fmt.Sprintf("Failed to apply default image tag %q: couldn't parse image name %q: %v", ref, ref, err)
		setWaiting("InvalidImageName", msg)
		p.event(warning, "InspectFailed", name, msg)
		p.event(warning, "Failed", name, "Error: InvalidImageName")
		for {
			if out, ok := p.sleep(ctx, c, time.Hour); !ok {
				return nil, ref, out, false
			}
		}
	}
	if policy == runtimev1.PullPolicy_PULL_POLICY_UNSPECIFIED {
		policy = runtimev1.PullPolicy_PULL_POLICY_IF_NOT_PRESENT
		if image.DefaultPullAlways(ref) {
			policy = runtimev1.PullPolicy_PULL_POLICY_ALWAYS
		}
	}
	for {
		img, present := p.m.cfg.Images.Lookup(ref)
		var reason, msg string
		switch {
		case policy == runtimev1.PullPolicy_PULL_POLICY_NEVER && !present:
			reason = "ErrImageNeverPull"
			msg = fmt.Sprintf("Container image %q is not present with pull policy of Never", ref)
			p.event(warning, "ErrImageNeverPull", name, msg)
		case present && policy != runtimev1.PullPolicy_PULL_POLICY_ALWAYS:
			p.event(normal, "Pulled", name, fmt.Sprintf("Container image %q already present on machine", ref))
			c.pullDelay = 0
			return img, ref, 0, true
		default:
			p.event(normal, "Pulling", name, fmt.Sprintf("Pulling image %q", ref))
			pctx, cancel := context.WithCancel(ctx)
			stop := context.AfterFunc(ctx, cancel)
			go func() {
				select {
				case <-c.stopc:
					cancel()
				case <-pctx.Done():
				}
			}()
			t0 := time.Now()
			pulled, err := p.m.cfg.Images.Pull(pctx, ref, secrets)
			stop()
			cancel()
			if err == nil {
				p.event(normal, "Pulled", name, fmt.Sprintf("Successfully pulled image %q in %s. Image size: %d bytes.", ref, time.Since(t0).Round(time.Millisecond), pulled.Size))
				c.pullDelay = 0
				return pulled, ref, 0, true
			}
			select {
			case <-c.stopc:
				return nil, ref, outStopped, false
			default:
			}
			if ctx.Err() != nil {
				return nil, ref, outDetached, false
			}
			reason, msg = "ErrImagePull", err.Error()
			p.event(warning, "Failed", name, fmt.Sprintf("Failed to pull image %q: %s", ref, msg))
			p.event(warning, "Failed", name, "Error: ErrImagePull")
		}
		setWaiting(reason, msg)
		cfg := p.m.cfg
		if c.pullDelay == 0 {
			c.pullDelay = cfg.ImagePullBackOffBase
		} else {
			c.pullDelay = min(2*c.pullDelay, cfg.ImagePullBackOffMax)
		}
		d := c.pullDelay
		if reason == "ErrImagePull" {
			// The kubelet reports ErrImagePull until its next sync, then
			// ImagePullBackOff while the back-off runs.
			first := min(d/2, time.Second)
			if out, ok := p.sleep(ctx, c, first); !ok {
				return nil, ref, out, false // a definition change retries at once
			}
			d -= first
			bmsg := fmt.Sprintf("Back-off pulling image %q: ErrImagePull: %s", ref, msg)
			setWaiting("ImagePullBackOff", bmsg)
			p.event(normal, "BackOff", name, fmt.Sprintf("Back-off pulling image %q", ref))
			p.event(warning, "Failed", name, "Error: ImagePullBackOff")
		}
		if out, ok := p.sleep(ctx, c, d); !ok {
			return nil, ref, out, false
		}
	}
}
