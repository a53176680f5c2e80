package pod

// One attempt of a container, from its ContainerCreating record to a
// started process: numbering, its root, its process, mounts, cgroups,
// the pod's network, the sandbox, the start.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/clone"
	"github.com/k3sm-dev/k3sm/internal/runtime/criolog"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

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
