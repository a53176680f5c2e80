package pod

// One attempt of a container, from its ContainerCreating record to a
// started process: runOnce and its steps in the order it takes them
// (numbering, start slot, root (root.go), process, mounts and cgroups, the
// pod's network, the sandbox, the start).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/criolog"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// attempt is one start of a container while runOnce prepares it: what
// each step needs from the steps before.
type attempt struct {
	c         *container
	img       *image.Image // nil: image "native"
	id        string       // <pod uid>/<name>/<restart count>
	name      string
	n         int32 // the restart count it runs under
	redo      bool  // it repeats an attempt that never started
	boxed     bool  // it runs in the sandbox
	spec      *runtimev1.PodSpec
	cspec     *runtimev1.ContainerSpec
	root      string
	rootImage string

	box          sandboxInput // boxed only
	res          resolved
	join         *sandbox.Join // kubectl debug --target in the sandbox
	keepLandlock bool
	ms           []mounts.Mount
	cgs          []string
	netns        string
	userns       string
	podIP        string
}

// refusedError is a container the sandbox refuses to start: it waits as
// CreateContainerConfigError (refuse). Any other error of a step is a
// StartError.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

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
	a, ok := p.newAttempt(c, img, usedRef)
	if !ok {
		return outRestart
	}
	p.removeOldAttempts(a)

	fail := func(msg string) outcome {
		now := time.Now()
		p.update(func() {
			c.state = containerState{Terminated: &terminated{ExitCode: 128, Reason: "StartError", Message: msg, StartedAt: now, FinishedAt: now, ContainerID: c.containerID}}
		})
		p.event(warning, "Failed", a.name, "Error: "+msg)
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
	failed := func(err error) outcome {
		var r *refusedError
		if errors.As(err, &r) {
			// A refused container waits until its pod changes: it must
			// not hold a start slot meanwhile, or a few of them would
			// keep every other pod of the node from starting.
			release()
			return p.refuse(ctx, c, r.msg)
		}
		return fail(err.Error())
	}

	if err := p.prepareRoot(a); err != nil {
		return failed(err)
	}
	if err := p.resolveAttempt(a); err != nil {
		return failed(err)
	}
	if err := p.prepareMounts(a); err != nil {
		return failed(err)
	}
	if out, ok := p.awaitNetwork(ctx, a); !ok {
		return out
	}
	sb, err := p.attemptSandbox(a)
	if err != nil {
		return failed(err)
	}
	proc, err := p.startProcess(ctx, a, sb)
	release()
	if err != nil {
		return fail(err.Error())
	}
	p.started(a, proc)
	return p.waitProc(ctx, c, true)
}

// newAttempt records c's next attempt (ContainerCreating, its number, id
// and state directory) and takes what the steps need under the lock.
// False: a definition change during the pull changed the image; pull
// again.
func (p *managedPod) newAttempt(c *container, img *image.Image, usedRef string) (*attempt, bool) {
	p.mu.Lock()
	// A definition change that arrived during the pull is already in
	// c.spec; start with it (and pull again if the image changed).
	select {
	case <-c.wake:
	default:
	}
	if c.spec.GetImage() != usedRef {
		p.mu.Unlock()
		return nil, false
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
	id := fmt.Sprintf("%s/%s/%d", p.uid, name, n)
	sum := sha256.Sum256([]byte(id))
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
	a := &attempt{c: c, img: img, id: id, name: name, n: n, redo: redo, boxed: boxed,
		spec: p.spec, cspec: c.spec, root: p.rootDir(c), rootImage: c.rootImage}
	p.mu.Unlock()
	p.changedNotify()
	return a, true
}

// removeOldAttempts removes what an unstarted attempt repeated now left,
// and the attempts older than the previous one.
func (p *managedPod) removeOldAttempts(a *attempt) {
	name, n := a.name, a.n
	if a.redo {
		// What the unstarted attempt left (a config, a shim log).
		os.RemoveAll(p.m.dirs().PodAttemptDir(p.uid, name, int(n)))
	}
	// Older attempts than the previous one are not needed (kubelet keeps
	// the previous log for --previous).
	if n >= 2 {
		os.RemoveAll(p.m.dirs().PodAttemptDir(p.uid, name, int(n-2)))
		criolog.RemoveAll(filepath.Join(p.logDir(), name, strconv.Itoa(int(n-2))+".log"))
	}
}

// resolveAttempt resolves the process the attempt runs, and for kubectl
// debug --target the target it joins.
func (p *managedPod) resolveAttempt(a *attempt) error {
	c, img, boxed := a.c, a.img, a.boxed
	resolveRoot := a.root
	if boxed && img == nil {
		resolveRoot = nativeRoot
	}
	res, err := resolveProcess(a.spec, a.cspec, img, resolveRoot, boxed)
	if err != nil {
		return err
	}
	if boxed && !hasEnv(res.Env, "HOME") {
		res.Env = append(res.Env, "HOME="+a.box.Identity.Home)
	}
	a.res = res
	// kubectl debug --target: the debugger is a container of its own (its
	// image as "/", its volume mounts) in the target's user, pid, UTS and
	// IPC namespaces. Outside the sandbox there are none to join: it sees
	// the target's processes as the node does.
	a.keepLandlock = true
	if c.target != "" {
		t, err := p.target(c)
		if err != nil {
			return err
		}
		if boxed {
			if !t.sandboxed {
				return fmt.Errorf("target container %q runs outside the sandbox (started before it was enabled): its namespaces cannot be joined; restart the pod", c.target)
			}
			a.join = &t.join
			// Landlock lets a process reach /proc/<pid>/root only of
			// processes in its own domain, which a debugger, started after
			// the target, cannot share. With both roots images, the
			// debugger goes without: through the target's root it reaches
			// what the target reaches, under the target's mount flags.
			// Either on the host's view keeps it: that view is bounded by
			// Landlock alone.
			a.keepLandlock = img == nil || t.native
		}
	}
	return nil
}

// prepareMounts sets up the attempt's volumes and mounts, its
// resolv.conf and its cgroups.
func (p *managedPod) prepareMounts(a *attempt) error {
	if a.boxed && len(a.cspec.GetVolumeMounts()) > 0 {
		// The pod owns its volumes before a subPath is made in one: the
		// directories made for it are then the pod's too.
		if err := p.setupVolumes(); err != nil {
			return err
		}
		if err := p.ownVolumes(a.spec); err != nil {
			return err
		}
	}
	ms, err := p.containerMounts(a.cspec, a.root, a.res.Env)
	if err != nil {
		return err
	}
	m, env, err := p.resolvConf(a.spec)
	if err != nil {
		return err
	}
	if m != nil && !slices.ContainsFunc(ms, func(v mounts.Mount) bool { return v.Target == m.Target }) {
		// Last: over whatever a volume put at /etc. A volume mounted at
		// /etc/resolv.conf itself is the container's choice and stays.
		ms = append(ms, *m)
	}
	tm, err := p.terminationMount(a, ms)
	if err != nil {
		return err
	}
	if tm != nil {
		ms = append(ms, *tm)
	}
	a.res.Env = append(a.res.Env, env...)
	a.ms = ms
	if a.boxed {
		// The volumes exist now (containerMounts sets them up).
		if err := p.ownVolumes(a.spec); err != nil {
			return err
		}
	}
	cgs, err := p.containerCgroups(a.spec, a.c, a.cspec)
	if err != nil {
		return err
	}
	a.cgs = cgs
	return nil
}

// awaitNetwork waits for the pod's network (set up since CreatePod, while
// the image was checked and all of the above was prepared): what is left
// needs its address and namespaces. False: the attempt does not start.
func (p *managedPod) awaitNetwork(ctx context.Context, a *attempt) (outcome, bool) {
	select {
	case <-p.netReady:
	case <-a.c.stopc:
		return outStopped, false
	case <-ctx.Done():
		return outDetached, false
	}
	p.mu.Lock()
	up := p.netUp
	a.netns, a.userns, a.podIP = p.net.NetNS, p.net.UserNS, p.net.IP
	p.mu.Unlock()
	if !up {
		// Deleted, or the daemon stops (the attempt never started: a
		// restarted daemon makes it again under its number).
		if ctx.Err() != nil {
			return outDetached, false
		}
		return outStopped, false
	}
	return 0, true
}

// attemptSandbox fills in the pod's address and builds the attempt's
// sandbox (or, where the boundary is a wrapper, the wrapper's).
func (p *managedPod) attemptSandbox(a *attempt) (*sandbox.Spec, error) {
	a.res.fillPodIP(a.podIP)
	if a.join != nil && sandbox.Rootless() && a.userns == "" {
		// A rootless shim cannot join a user namespace: it starts in the
		// target's (each container has its own without a pod network),
		// where it is root. The shim checks it is the target's.
		a.userns = fmt.Sprintf("/proc/%d/ns/user", a.join.Pid)
	}
	var sb *sandbox.Spec
	var err error
	if a.boxed {
		box := a.box
		box.PodUserNS = a.userns
		etc, err := p.etcFiles(box.Hostname, a.podIP, a.ms)
		if err != nil {
			return nil, err
		}
		a.ms = append(a.ms, etc...)
		if a.img == nil {
			a.ms = append(a.ms, mounts.Mount{Source: a.root, Target: nativeRoot})
		}
		box.addMounts(a.ms)
		if sb, err = buildSandbox(box); err != nil {
			return nil, &refusedError{err.Error()}
		}
		if sandbox.Rootless() {
			sb.Own = p.rootlessOwners(a.spec)
		}
		sb.Join = a.join
		if !a.keepLandlock {
			sb.Landlock = nil
		}
	}
	if !a.boxed {
		// Where the boundary is a wrapper (darwin's Seatbelt).
		in := sandboxInput{Pod: a.spec, Container: a.cspec, PodDir: p.dir, Root: a.root, Native: a.img == nil}
		in.addMounts(a.ms)
		if sb, err = wrapperSandbox(in); err != nil {
			return nil, &refusedError{err.Error()}
		}
	}
	return sb, nil
}

// startProcess starts the attempt's process through the Starter (the shim).
func (p *managedPod) startProcess(ctx context.Context, a *attempt, sb *sandbox.Spec) (Process, error) {
	cspec, res := a.cspec, a.res
	return p.m.cfg.Starter.Start(ctx, ProcessSpec{ID: a.id, Argv: res.Argv, Env: res.Env, Dir: res.Dir,
		LogPath:    filepath.Join(p.logDir(), a.name, strconv.Itoa(int(a.n))+".log"),
		LogMaxSize: p.m.cfg.ContainerLogMaxSize, LogMaxFiles: p.m.cfg.ContainerLogMaxFiles, StateDir: a.c.stateDir,
		Stdin: cspec.GetStdin(), StdinOnce: cspec.GetStdinOnce(), TTY: cspec.GetTty(), Mounts: a.ms, NetNS: a.netns, UserNS: a.userns, Sandbox: sb, Cgroups: a.cgs})
}

// started records the attempt's process and announces it.
func (p *managedPod) started(a *attempt, proc Process) {
	c, cspec, name := a.c, a.cspec, a.name
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
}
