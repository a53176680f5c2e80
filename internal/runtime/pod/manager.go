// Package pod owns the pod lifecycle as the kubelet runs it, on native
// processes: init containers one at a time, then the containers; restart
// policies with CrashLoopBackOff; image pull policies with ImagePullBackOff;
// graceful termination; phases and container states; events; and the
// on-disk state under <data>/pods/<uid>/ that lets a restarted daemon
// re-attach to the shims of running containers instead of recreating them.
package pod

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
)

// Images is what the lifecycle needs from the image store.
type Images interface {
	Lookup(ref string) (*image.Image, bool)
	Get(id string) (*image.Image, bool)
	Pull(ctx context.Context, ref string, secrets [][]byte) (*image.Image, error)
}

// Config configures a Manager. Zero durations take the kubelet's values.
type Config struct {
	// DataDir holds pods/<uid>/ and logs/pods/.
	DataDir string
	Images  Images
	Starter Starter
	// CrashLoopBackOff: first restart at once, then Base doubling to Max;
	// reset when a container ran for BackOffResetAfter.
	CrashLoopBackOffBase time.Duration // 10 s
	CrashLoopBackOffMax  time.Duration // 300 s
	BackOffResetAfter    time.Duration // 10 min
	// DisableSandbox runs containers without the sandbox (the host's view,
	// the daemon's user): for side-by-side benchmarks only.
	DisableSandbox bool
	// ShimPath is the k3sm-shim binary, which also enters a sandboxed
	// container for exec, exec probes and hooks (sandbox.EnterArgv).
	ShimPath string
	// ImagePullBackOff: Base doubling to Max.
	ImagePullBackOffBase time.Duration // 10 s
	ImagePullBackOffMax  time.Duration // 300 s
	// EmptyDirCheckInterval is how often emptyDir usage is measured against
	// sizeLimit (10 s; the kubelet's eviction manager also runs every 10 s).
	EmptyDirCheckInterval time.Duration
	// ContainerLogMaxSize and ContainerLogMaxFiles rotate container logs
	// (the shim rotates its own); zero size: never.
	ContainerLogMaxSize  int64
	ContainerLogMaxFiles int
	// Network gives pods their own network namespace and address; nil:
	// pods share the node's network.
	Network Network
	// DNSShimLib is the getaddrinfo interposer darwin pods load to use
	// the cluster DNS (DNSShimLibName next to k3sm-shim); used only where
	// containers get no mount namespace, and only if the file exists.
	DNSShimLib string
	// Cgroups gives every pod and container attempt a cgroup with its
	// limits (see resources.go); nil or cgroups.None: the sampler.
	Cgroups *cgroups.Manager
	Logger  *slog.Logger
}

// ErrNotFound is returned for an unknown pod or container.
var ErrNotFound = errors.New("not found")

// InvalidSpecError is a pod spec the daemon refuses.
type InvalidSpecError struct{ Msg string }

func (e *InvalidSpecError) Error() string { return e.Msg }

// Manager runs every pod of the node.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	hub    *hub
	bootID string

	mu   sync.Mutex
	ctx  context.Context
	pods map[string]*managedPod
	wg   sync.WaitGroup

	startSlots chan struct{} // bounds concurrent container starts
	res        resourceState // the resource sampler's (resources.go)
}

// NewManager checks cfg and prepares the directories.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("pod manager: DataDir is required")
	}
	if cfg.Images == nil || cfg.Starter == nil {
		return nil, errors.New("pod manager: Images and Starter are required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.CrashLoopBackOffBase, 10*time.Second)
	def(&cfg.CrashLoopBackOffMax, 300*time.Second)
	def(&cfg.BackOffResetAfter, 10*time.Minute)
	def(&cfg.ImagePullBackOffBase, 10*time.Second)
	def(&cfg.ImagePullBackOffMax, 300*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	dirs := datadir.New(cfg.DataDir)
	for _, d := range []string{dirs.PodsDir(), dirs.PodLogsDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	b := make([]byte, 8)
	rand.Read(b)
	return &Manager{cfg: cfg, log: cfg.Logger, hub: newHub(), bootID: hex.EncodeToString(b), pods: map[string]*managedPod{},
		startSlots: make(chan struct{}, 2*runtime.NumCPU())}, nil
}

// BootID changes with every daemon start; event sequence numbers are only
// meaningful within one boot.
func (m *Manager) BootID() string { return m.bootID }

func (m *Manager) dirs() datadir.Layout     { return datadir.New(m.cfg.DataDir) }
func (m *Manager) podDir(uid string) string { return m.dirs().PodDir(uid) }

// logDir is <data>/logs/pods/<ns>_<name>_<uid>, as the kubelet lays out
// /var/log/pods.
func (p *managedPod) logDir() string {
	return datadir.New(p.m.cfg.DataDir).PodLogDir(p.namespace, p.name, p.uid)
}

// Start re-attaches to the pods recorded on disk and starts their workers.
// ctx is the daemon's lifetime: when it ends, workers detach from their
// containers and leave them running.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	m.ctx = ctx
	m.mu.Unlock()
	entries, err := os.ReadDir(datadir.New(m.cfg.DataDir).PodsDir())
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		p, running, err := m.load(e.Name())
		if err != nil {
			m.unreadable(e.Name(), err)
			m.removeCgroupsOf(e.Name())
			continue
		}
		m.mu.Lock()
		m.pods[p.uid] = p
		m.mu.Unlock()
		m.log.Info("re-attached pod", "pod", p.key(), "running", running)
		p.event(runtimev1.EventType_EVENT_TYPE_NORMAL, "PodReattached", "",
			fmt.Sprintf("Runtime daemon restarted: re-attached to %d running container(s) without restarting them", running))
		m.startWorker(p)
		p.startEphemeral()
		if p.terminating {
			go m.finishDelete(p)
		}
	}
	go m.enforceEmptyDirLimits(ctx)
	go m.releaseOrphans(ctx, time.Minute)
	go m.enforceResources(ctx)
	return nil
}

// Wait blocks until every worker detached (after the Start context ended).
func (m *Manager) Wait() { m.wg.Wait() }

func (m *Manager) startWorker(p *managedPod) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		p.run(m.ctx)
	}()
}

// validate refuses specs the lifecycle cannot run.
func validate(spec *runtimev1.PodSpec) error {
	if spec == nil {
		return &InvalidSpecError{"pod: spec is required"}
	}
	if spec.GetUid() == "" || filepath.Base(spec.GetUid()) != spec.GetUid() || spec.GetUid() == "." || spec.GetUid() == ".." {
		return &InvalidSpecError{fmt.Sprintf("pod.uid %q: must be a non-empty uid without slashes", spec.GetUid())}
	}
	if spec.GetName() == "" || spec.GetNamespace() == "" {
		return &InvalidSpecError{"pod.name and pod.namespace are required"}
	}
	if len(spec.GetContainers()) == 0 {
		return &InvalidSpecError{"pod.containers: at least one container is required"}
	}
	seen := map[string]bool{}
	for _, c := range allSpecs(spec) {
		if c.GetName() == "" || filepath.Base(c.GetName()) != c.GetName() || c.GetName() == "." || c.GetName() == ".." {
			return &InvalidSpecError{fmt.Sprintf("container name %q: must be a DNS label", c.GetName())}
		}
		if seen[c.GetName()] {
			return &InvalidSpecError{fmt.Sprintf("container name %q is used twice", c.GetName())}
		}
		seen[c.GetName()] = true
		if c.GetImage() == "" {
			return &InvalidSpecError{fmt.Sprintf("container %q: image is required (an OCI reference, or %q with an absolute command)", c.GetName(), NativeImage)}
		}
	}
	for _, ec := range spec.GetEphemeralContainers() {
		if ec.GetContainer() == nil {
			return &InvalidSpecError{"pod.ephemeral_containers: container is required"}
		}
		if t := ec.GetTargetContainerName(); t != "" && !slices.ContainsFunc(append(slices.Clone(spec.GetInitContainers()), spec.GetContainers()...),
			func(c *runtimev1.ContainerSpec) bool { return c.GetName() == t }) {
			return &InvalidSpecError{fmt.Sprintf("ephemeral container %q: target container %q is not a container of the pod", ec.GetContainer().GetName(), t)}
		}
	}
	return nil
}

// allSpecs lists the init, regular and ephemeral containers of spec.
func allSpecs(spec *runtimev1.PodSpec) []*runtimev1.ContainerSpec {
	out := append(slices.Clone(spec.GetInitContainers()), spec.GetContainers()...)
	for _, ec := range spec.GetEphemeralContainers() {
		out = append(out, ec.GetContainer())
	}
	return out
}

// Create admits a pod and starts its worker. An existing uid is returned as
// is.
func (m *Manager) Create(spec *runtimev1.PodSpec) (*runtimev1.PodStatus, error) {
	if err := validate(spec); err != nil {
		return nil, err
	}
	m.mu.Lock()
	if p, ok := m.pods[spec.GetUid()]; ok {
		m.mu.Unlock()
		return p.status(), nil
	}
	if m.ctx == nil {
		m.mu.Unlock()
		return nil, errors.New("pod manager not started")
	}
	p := m.newPod(proto.Clone(spec).(*runtimev1.PodSpec))
	p.startTime = time.Now()
	m.pods[p.uid] = p
	m.mu.Unlock()
	// Disk work outside the manager lock: status reads must not wait.
	err := os.MkdirAll(p.dir, 0o700)
	if err == nil {
		// Atomic but not fsynced (a journal commit less before the
		// start): until its first ContainerCreating record, which is
		// durable and comes before any process, the pod holds nothing
		// the API does not, and a daemon that dies still finds it.
		err = p.saveWith(false)
	}
	if err != nil {
		m.mu.Lock()
		delete(m.pods, p.uid)
		m.mu.Unlock()
		return nil, err
	}
	m.hub.changed(p.uid)
	m.startWorker(p)
	p.startEphemeral()
	return p.status(), nil
}

func (m *Manager) newPod(spec *runtimev1.PodSpec) *managedPod {
	p := &managedPod{m: m, uid: spec.GetUid(), name: spec.GetName(), namespace: spec.GetNamespace(), dir: m.podDir(spec.GetUid()), spec: spec,
		deleteCh: make(chan struct{}), done: make(chan struct{}), removed: make(chan struct{}), ephStop: make(chan struct{}),
		netReady: make(chan struct{})}
	for _, c := range spec.GetInitContainers() {
		p.init = append(p.init, newContainer(c, true, p.deleteCh))
	}
	for _, c := range spec.GetContainers() {
		p.main = append(p.main, newContainer(c, false, p.deleteCh))
	}
	for _, ec := range spec.GetEphemeralContainers() {
		p.ephemeral = append(p.ephemeral, p.newEphemeral(ec))
	}
	return p
}

// newEphemeral is an ephemeral container: it stops when the pod is deleted
// or its worker finished (see run).
func (p *managedPod) newEphemeral(ec *runtimev1.EphemeralContainerSpec) *container {
	c := newContainer(ec.GetContainer(), false, p.ephStop)
	c.ephemeral, c.target = true, ec.GetTargetContainerName()
	return c
}

func newContainer(c *runtimev1.ContainerSpec, init bool, deleteCh chan struct{}) *container {
	x := &container{spec: c, name: c.GetName(), init: init, wake: make(chan struct{}, 1), stopc: deleteCh,
		state: containerState{Waiting: &waiting{Reason: "ContainerCreating"}}}
	if x.sidecar() {
		// Native sidecars stop after the main containers: the worker
		// closes their own channel once those are gone.
		x.stopc = make(chan struct{})
	}
	return x
}

// Update replaces the pod's spec; containers whose definition changed (see
// definitionChanged) restart with it. A container that does not restart
// keeps the env it runs with and starts next time with the new one.
func (m *Manager) Update(spec *runtimev1.PodSpec) (*runtimev1.PodStatus, error) {
	if err := validate(spec); err != nil {
		return nil, err
	}
	p := m.get(spec.GetUid())
	if p == nil {
		return nil, fmt.Errorf("pod %s: %w", spec.GetUid(), ErrNotFound)
	}
	if spec.GetName() != p.name || spec.GetNamespace() != p.namespace {
		return nil, &InvalidSpecError{fmt.Sprintf("pod %s: name and namespace cannot change (%s/%s -> %s/%s)", p.uid, p.namespace, p.name, spec.GetNamespace(), spec.GetName())}
	}
	spec = proto.Clone(spec).(*runtimev1.PodSpec)
	p.mu.Lock()
	added := p.mergeEphemeralLocked(spec)
	p.spec = spec
	byName := map[string]*runtimev1.ContainerSpec{}
	for _, c := range append(append([]*runtimev1.ContainerSpec{}, spec.GetInitContainers()...), spec.GetContainers()...) {
		byName[c.GetName()] = c
	}
	for _, c := range p.all() {
		nc, ok := byName[c.spec.GetName()]
		if !ok {
			continue
		}
		changed := definitionChanged(c.spec, nc)
		c.nextEnv, c.envPending = nil, false
		if !changed && !proto.Equal(&runtimev1.ContainerSpec{Env: c.spec.GetEnv()}, &runtimev1.ContainerSpec{Env: nc.GetEnv()}) {
			// The env a container was started with stays in its spec
			// (exec, probes and pod.json see what its process has); the
			// new env is for its next start (applyNextEnv), where the
			// kubelet would resolve it.
			c.nextEnv, c.envPending = nc.GetEnv(), true
			nc.Env = c.spec.GetEnv()
		}
		c.spec = nc
		if changed && !(c.init && c.succeeded()) {
			c.changed = true
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
	p.mu.Unlock()
	if added {
		p.startEphemeral()
	}
	p.changedNotify()
	return p.status(), nil
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

// definitionChanged reports that a running container must stop and start
// again for the new spec b. The kubelet decides that from its container
// hash, over the API spec; a provider that sends it (definition_hash)
// gets exactly that: a change of what the provider resolves (env from
// labels, annotations, ConfigMaps, Secrets) restarts nothing, and only
// reaches the container when it starts again. Without a hash (an older
// provider) the resolved fields are compared, as v1 always did; a running
// container from before the provider sent hashes is compared without env,
// whose resolution changed meaning with the hash (verbatim values).
func definitionChanged(a, b *runtimev1.ContainerSpec) bool {
	ha, hb := a.GetDefinitionHash(), b.GetDefinitionHash()
	switch {
	case ha != "" && hb != "":
		return ha != hb
	case hb != "":
		return !proto.Equal(stripDefinition(a, false), stripDefinition(b, false))
	}
	return !proto.Equal(stripDefinition(a, true), stripDefinition(b, true))
}

// applyNextEnv gives c the env of the last update, for the attempt about to
// start. Caller holds p.mu. The pod spec is replaced, not changed in place:
// readers outside the lock keep the one they took.
func (p *managedPod) applyNextEnv(c *container) {
	spec := proto.Clone(p.spec).(*runtimev1.PodSpec)
	byName := map[string]*runtimev1.ContainerSpec{}
	for _, x := range append(append([]*runtimev1.ContainerSpec{}, spec.GetInitContainers()...), spec.GetContainers()...) {
		byName[x.GetName()] = x
	}
	for _, x := range p.all() {
		if s, ok := byName[x.name]; ok {
			x.spec = s
		}
	}
	if s, ok := byName[c.name]; ok {
		s.Env = c.nextEnv
	} else {
		cs := proto.Clone(c.spec).(*runtimev1.ContainerSpec)
		cs.Env = c.nextEnv
		c.spec = cs
	}
	p.spec = spec
	c.nextEnv, c.envPending = nil, false
}

// stripDefinition keeps the fields whose change restarts a container of an
// older provider (one that sends no definition_hash).
func stripDefinition(c *runtimev1.ContainerSpec, env bool) *runtimev1.ContainerSpec {
	s := &runtimev1.ContainerSpec{Name: c.GetName(), Image: c.GetImage(), ImagePullPolicy: c.GetImagePullPolicy(),
		Command: c.GetCommand(), Args: c.GetArgs(), WorkingDir: c.GetWorkingDir()}
	if env {
		s.Env = c.GetEnv()
	}
	return s
}

// Delete stops the pod's containers (SIGTERM, grace, SIGKILL) and removes
// its files. grace overrides the pod's terminationGracePeriodSeconds.
func (m *Manager) Delete(ctx context.Context, uid string, grace *int64, wait bool) error {
	p := m.get(uid)
	if p == nil {
		return fmt.Errorf("pod %s: %w", uid, ErrNotFound)
	}
	p.mu.Lock()
	first := !p.terminating
	if first {
		p.terminating = true
		g := int64(30)
		if p.spec.TerminationGracePeriodSeconds != nil {
			g = p.spec.GetTerminationGracePeriodSeconds()
		}
		if grace != nil {
			g = *grace
		}
		if g < 0 {
			g = 0
		}
		p.grace = time.Duration(g) * time.Second
		p.graceEnd = time.Now().Add(p.grace)
		p.stopAll()
	}
	p.mu.Unlock()
	if first {
		p.changedNotify()
		go m.finishDelete(p)
	}
	if !wait {
		return nil
	}
	select {
	case <-p.removed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// finishDelete waits for the worker to stop every container, then removes
// the pod's directories.
func (m *Manager) finishDelete(p *managedPod) {
	select {
	case <-p.done:
	case <-m.ctx.Done():
		return // daemon stopping: the next daemon finishes the delete
	}
	m.releaseNetwork(p)
	m.removeCgroupsOf(p.uid)
	last := p.status()
	// A volume refresh may be writing a token or a ConfigMap into the pod's
	// directory right now: wait for it, and make later ones stop.
	p.volMu.Lock()
	p.volGone = true
	p.volMu.Unlock()
	if err := os.RemoveAll(p.dir); err != nil {
		m.log.Error("remove pod directory", "dir", p.dir, "err", err)
	}
	if err := os.RemoveAll(p.logDir()); err != nil {
		m.log.Error("remove pod logs", "pod", p.key(), "err", err)
	}
	m.mu.Lock()
	delete(m.pods, p.uid)
	m.mu.Unlock()
	m.hub.removed(last)
	close(p.removed)
	m.log.Info("pod removed", "pod", p.key())
}

func (m *Manager) get(uid string) *managedPod {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pods[uid]
}

// Count returns how many pods the manager holds.
func (m *Manager) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pods)
}

// Status returns a pod's status.
func (m *Manager) Status(uid string) (*runtimev1.PodStatus, error) {
	p := m.get(uid)
	if p == nil {
		return nil, fmt.Errorf("pod %s: %w", uid, ErrNotFound)
	}
	return p.status(), nil
}

// List returns every pod's status and spec, ordered by namespace/name.
func (m *Manager) List() ([]*runtimev1.PodStatus, []*runtimev1.PodSpec) {
	m.mu.Lock()
	ps := make([]*managedPod, 0, len(m.pods))
	for _, p := range m.pods {
		ps = append(ps, p)
	}
	m.mu.Unlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i].key() < ps[j].key() })
	var sts []*runtimev1.PodStatus
	var specs []*runtimev1.PodSpec
	for _, p := range ps {
		sts = append(sts, p.status())
		p.mu.Lock()
		specs = append(specs, proto.Clone(p.spec).(*runtimev1.PodSpec))
		p.mu.Unlock()
	}
	return sts, specs
}

// Subscribe starts a watch. Events of this boot after afterSeq are replayed
// (all buffered events when bootID is another boot's).
func (m *Manager) Subscribe(bootID string, afterSeq uint64) *Subscription {
	if bootID != m.bootID {
		afterSeq = 0
	}
	return m.hub.subscribe(afterSeq)
}

// ContainerInfo describes one container for logs, exec and stats.
type ContainerInfo struct {
	Pod          *runtimev1.PodSpec
	Spec         *runtimev1.ContainerSpec
	RestartCount int32
	// LogDir holds <restartCount>.log files.
	LogDir string
	// Running attempt's process group, 0 when not running.
	Pid int
	// Proc is the running attempt (nil when not running).
	Proc Process
	Root string
	// Image the container runs (nil for native or before the first pull).
	Image *image.Image
	// PodIP is the pod's own address ("" in the node's network).
	PodIP string
	// Sandboxed: the attempt in StateDir runs in the sandbox.
	Sandboxed bool
	StateDir  string
}

// Container looks a container up; name may be empty for a pod with one
// container.
func (m *Manager) Container(uid, name string) (ContainerInfo, error) {
	p := m.get(uid)
	if p == nil {
		return ContainerInfo{}, fmt.Errorf("pod %s: %w", uid, ErrNotFound)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var c *container
	if name == "" {
		if len(p.main) != 1 {
			var names []string
			for _, x := range p.main {
				names = append(names, x.spec.GetName())
			}
			return ContainerInfo{}, &InvalidSpecError{fmt.Sprintf("pod %s has %d containers %v: name one", p.key(), len(p.main), names)}
		}
		c = p.main[0]
	} else {
		for _, x := range p.all() {
			if x.spec.GetName() == name {
				c = x
			}
		}
	}
	if c == nil {
		return ContainerInfo{}, fmt.Errorf("container %q in pod %s: %w", name, p.key(), ErrNotFound)
	}
	info := ContainerInfo{Pod: p.spec, Spec: c.spec, RestartCount: c.restartCount,
		LogDir: filepath.Join(p.logDir(), c.spec.GetName()), Root: p.rootDir(c), PodIP: p.net.IP,
		Sandboxed: c.sandboxed, StateDir: c.stateDir}
	if c.proc != nil && c.state.Running != nil {
		info.Pid = c.proc.Pid()
		info.Proc = c.proc
	}
	if c.imageDigest != "" {
		info.Image, _ = m.cfg.Images.Get(c.imageDigest)
	}
	return info, nil
}

// AttemptRunning reports whether attempt restart of the container runs.
func (m *Manager) AttemptRunning(uid, name string, restart int32) bool {
	p := m.get(uid)
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.all() {
		if c.spec.GetName() == name {
			return c.restartCount == restart && c.state.Running != nil
		}
	}
	return false
}

// ResolveExec resolves a command as the container would run it; tty is
// the terminal device it will run on ("" none).
func (m *Manager) ResolveExec(info ContainerInfo, command []string, tty string) (argv, env []string, dir string, err error) {
	cs := proto.Clone(info.Spec).(*runtimev1.ContainerSpec)
	cs.Command, cs.Args = command, nil
	if cs.GetImage() != NativeImage && info.Image == nil {
		return nil, nil, "", errors.New("container has not started yet")
	}
	root := info.Root
	if info.Sandboxed && info.Image == nil {
		root = nativeRoot
	}
	r, err := resolveProcess(info.Pod, cs, info.Image, root, info.Sandboxed)
	if err != nil {
		return nil, nil, "", err
	}
	r.fillPodIP(info.PodIP)
	argv, dir, err = m.enter(info.Sandboxed, info.StateDir, info.Pid, r.Dir, r.Argv, tty)
	return argv, r.Env, dir, err
}

// ---------------------------------------------------------------- state

type waiting struct {
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

type running struct {
	StartedAt time.Time `json:"startedAt"`
}

type terminated struct {
	ExitCode    int       `json:"exitCode"`
	Signal      int       `json:"signal,omitempty"`
	Reason      string    `json:"reason"`
	Message     string    `json:"message,omitempty"`
	StartedAt   time.Time `json:"startedAt"`
	FinishedAt  time.Time `json:"finishedAt"`
	ContainerID string    `json:"containerID,omitempty"`
}

// containerState is a container's state as the API shows it: exactly one
// of waiting, running or terminated.
type containerState struct {
	Waiting    *waiting    `json:"waiting,omitempty"`
	Running    *running    `json:"running,omitempty"`
	Terminated *terminated `json:"terminated,omitempty"`
}

// container is one container's lifecycle state. Guarded by its pod's mu, except
// the fields only the container's own goroutine touches (noted).
type container struct {
	spec *runtimev1.ContainerSpec // replaced by Update, under the pod's mu
	name string                   // immutable
	init bool
	// ephemeral: an ephemeral container (kubectl debug), run once; target
	// is the container whose mount namespace it joins (may be empty).
	ephemeral bool
	target    string
	launched  bool // its goroutine was started (under the pod's mu)

	restartCount int32
	hasRun       bool
	// unstarted: the recorded attempt never started its process (the
	// daemon died while starting it); the next attempt repeats it without
	// counting a restart. Not persisted: load finds it again.
	unstarted   bool
	stateDir    string
	containerID string
	state       containerState
	last        *terminated
	imageID     string
	imageDigest string
	rootImage   string
	// sandboxed: the current attempt runs in the sandbox (exec enters it).
	sandboxed bool
	changed   bool // spec changed: restart without back-off
	// nextEnv is the env of an update that did not restart the container:
	// its next attempt starts with it (envPending). Not persisted: after a
	// daemon restart the next attempt has the env it ran with until the
	// provider updates the pod again.
	nextEnv    []*runtimev1.EnvVar
	envPending bool
	// limitsNoted: whether its limits the kernel does not enforce were
	// told (LimitNotEnforced, once per daemon; under the pod's mu).
	limitsNoted bool

	proc Process
	wake chan struct{}
	// stopc is closed when the container must stop for good: the pod's
	// deleteCh, or for a native sidecar a channel the worker closes after
	// the main containers stopped.
	stopc chan struct{}
	// Probe results of the running attempt (reset at each attempt, not
	// persisted: a restarted daemon probes again).
	probeStarted bool // startup probe passed (or none) and postStart done
	probeReady   bool // readiness probe passing (or none)
	// back-off, touched only by the container's goroutine
	crashDelay time.Duration
	pullDelay  time.Duration
}

// sidecar reports a native sidecar: an init container with restartPolicy
// Always.
func (c *container) sidecar() bool {
	return c.init && c.spec.GetRestartPolicy() == runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS
}

func (c *container) succeeded() bool {
	return c.state.Terminated != nil && c.state.Terminated.ExitCode == 0
}

type persistedContainer struct {
	Name         string         `json:"name"`
	RestartCount int32          `json:"restartCount"`
	HasRun       bool           `json:"hasRun,omitempty"`
	StateDir     string         `json:"stateDir,omitempty"`
	ContainerID  string         `json:"containerID,omitempty"`
	State        containerState `json:"state"`
	Last         *terminated    `json:"last,omitempty"`
	ImageID      string         `json:"imageID,omitempty"`
	ImageDigest  string         `json:"imageDigest,omitempty"`
	RootImage    string         `json:"rootImage,omitempty"`
	Sandboxed    bool           `json:"sandboxed,omitempty"`
}

type persistedPod struct {
	Spec         json.RawMessage      `json:"spec"`
	StartTime    time.Time            `json:"startTime"`
	Terminating  bool                 `json:"terminating,omitempty"`
	GraceSeconds int64                `json:"graceSeconds,omitempty"`
	Evicted      string               `json:"evicted,omitempty"`
	Network      *PodNetwork          `json:"network,omitempty"`
	IDSlot       int32                `json:"idSlot,omitempty"`
	Containers   []persistedContainer `json:"containers"`
}

// managedPod is one pod the Manager runs: its spec, its containers' states
// and its worker's life.
type managedPod struct {
	m               *Manager
	uid             string
	name, namespace string // immutable, like uid
	dir             string

	mu          sync.Mutex
	spec        *runtimev1.PodSpec
	init, main  []*container
	ephemeral   []*container // ephemeral containers, in the order they were added
	startTime   time.Time
	terminating bool
	grace       time.Duration
	graceEnd    time.Time // when the pod's grace period ends (terminating)
	revision    uint64
	saveSeq     uint64     // snapshots taken (under mu)
	net         PodNetwork // the pod's own network, once set up
	// netReady is closed once the worker's network set-up ended; netUp:
	// it succeeded (under mu). Containers wait for it before they start.
	netReady chan struct{}
	netUp    bool
	// idSlot is the pod's user-namespace range (sandbox), 0 until given.
	idSlot atomic.Int32

	saveMu  sync.Mutex
	written uint64 // newest snapshot on disk (under saveMu)

	// volMu serializes volume set-up and content updates; volReady: the
	// volumes exist on disk; volGone: the pod's directory is being removed,
	// and an update must not write into it (nor its pod.json) again.
	volMu    sync.Mutex
	volReady bool
	volGone  bool

	// evicted is the eviction message (the kubelet's "Evicted" reason): the
	// containers are stopped, the pod stays Failed until it is deleted.
	evicted  string
	stopOnce sync.Once
	deleteCh chan struct{} // closed when deletion (or eviction) starts
	// ephStop is the ephemeral containers' stop channel: closed when
	// deletion starts or the worker finished (the pod is terminal).
	ephStop     chan struct{}
	ephStopOnce sync.Once
	ephWG       sync.WaitGroup // goroutines of ephemeral containers
	ephClosed   bool           // the worker ended: start no more (under mu)
	done        chan struct{}  // closed when the worker returned
	removed     chan struct{}  // closed when the pod is gone
}

func (p *managedPod) key() string { return p.namespace + "/" + p.name }

// stopAll makes the worker stop every container (deletion or eviction).
func (p *managedPod) stopAll() { p.stopOnce.Do(func() { close(p.deleteCh) }) }

func (p *managedPod) all() []*container {
	return append(append(append([]*container{}, p.init...), p.main...), p.ephemeral...)
}

func (p *managedPod) rootDir(c *container) string { return p.m.dirs().PodRootDir(p.uid, c.name) }

// save writes pod.json. The snapshot is taken under p.mu, the write is
// not: on ext4 a replace-by-rename may wait for writeback, and status reads
// must not wait for the disk.
func (p *managedPod) save() error { return p.saveWith(true) }

// saveWith is save, fsynced or only atomic.
func (p *managedPod) saveWith(durable bool) error {
	p.mu.Lock()
	b, seq, err := p.snapshotLocked()
	p.mu.Unlock()
	if err != nil {
		return err
	}
	return p.write(b, seq, durable)
}

// write stores snapshot seq unless a newer one was stored already.
func (p *managedPod) write(b []byte, seq uint64, durable bool) error {
	p.saveMu.Lock()
	defer p.saveMu.Unlock()
	if seq <= p.written {
		return nil
	}
	state := p.m.dirs().PodStateFile(p.uid)
	if err := writeState(filepath.Dir(state), filepath.Base(state), b, durable); err != nil {
		return err
	}
	p.written = seq
	return nil
}

// writeState replaces dir/name with b so that a crash leaves the old or the
// new content: temp file, fsync, rename, fsync of the directory. Not
// durable: no fsync, so only a crash of the daemon (not of the machine)
// is sure to leave one or the other.
func writeState(dir, name string, b []byte, durable bool) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if !durable {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// snapshotLocked serializes the pod's state. Caller holds p.mu.
func (p *managedPod) snapshotLocked() ([]byte, uint64, error) {
	spec, err := protojson.Marshal(p.spec)
	if err != nil {
		return nil, 0, err
	}
	pp := persistedPod{Spec: spec, StartTime: p.startTime, Terminating: p.terminating, GraceSeconds: int64(p.grace / time.Second), Evicted: p.evicted, IDSlot: p.idSlot.Load()}
	if p.net.IP != "" {
		pn := p.net
		pp.Network = &pn
	}
	for _, c := range p.all() {
		pp.Containers = append(pp.Containers, persistedContainer{Name: c.spec.GetName(), RestartCount: c.restartCount, HasRun: c.hasRun,
			StateDir: c.stateDir, ContainerID: c.containerID, State: c.state, Last: c.last, ImageID: c.imageID,
			ImageDigest: c.imageDigest, RootImage: c.rootImage, Sandboxed: c.sandboxed})
	}
	b, err := json.MarshalIndent(pp, "", " ")
	if err != nil {
		return nil, 0, err
	}
	p.saveSeq++
	return b, p.saveSeq, nil
}

// load rebuilds a pod from pod.json and re-attaches to its shims. It
// returns how many containers are still running.
func (m *Manager) load(uid string) (*managedPod, int, error) {
	b, err := os.ReadFile(m.dirs().PodStateFile(uid))
	if err != nil {
		return nil, 0, err
	}
	var pp persistedPod
	if err := json.Unmarshal(b, &pp); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", filepath.Base(m.dirs().PodStateFile(uid)), err)
	}
	spec := &runtimev1.PodSpec{}
	if err := protojson.Unmarshal(pp.Spec, spec); err != nil {
		return nil, 0, fmt.Errorf("%s spec: %w", filepath.Base(m.dirs().PodStateFile(uid)), err)
	}
	if spec.GetUid() != uid {
		return nil, 0, fmt.Errorf("%s names uid %q, not its directory's", filepath.Base(m.dirs().PodStateFile(uid)), spec.GetUid())
	}
	p := m.newPod(spec)
	p.startTime = pp.StartTime
	p.terminating = pp.Terminating
	p.grace = time.Duration(pp.GraceSeconds) * time.Second
	p.graceEnd = time.Now().Add(p.grace)
	p.evicted = pp.Evicted
	p.idSlot.Store(pp.IDSlot)
	if pp.Network != nil {
		p.net = *pp.Network
	}
	if p.terminating || p.evicted != "" {
		p.stopAll()
	}
	byName := map[string]persistedContainer{}
	for _, pc := range pp.Containers {
		byName[pc.Name] = pc
	}
	nRunning := 0
	for _, c := range p.all() {
		pc, ok := byName[c.spec.GetName()]
		if !ok {
			continue
		}
		c.restartCount, c.hasRun, c.stateDir, c.containerID = pc.RestartCount, pc.HasRun, pc.StateDir, pc.ContainerID
		c.state, c.last, c.imageID, c.imageDigest, c.rootImage = pc.State, pc.Last, pc.ImageID, pc.ImageDigest, pc.RootImage
		c.sandboxed = pc.Sandboxed
		if c.stateDir == "" || (c.state.Running == nil && c.state.Waiting == nil) {
			continue
		}
		if c.state.Waiting != nil && !c.hasRun {
			continue
		}
		proc, alive, err := m.cfg.Starter.Attach(c.stateDir)
		// Waiting after a recorded end of this attempt (c.last: a start
		// failure, then back-off) is a restart to come, whatever the shim
		// left.
		current := c.last == nil || c.last.ContainerID != c.containerID
		if err != nil && c.state.Waiting != nil && current && errors.Is(err, ErrNotStarted) {
			// The daemon died while it started this attempt, before its
			// process ran (waiting for a start slot, cloning the root,
			// spawning the shim): the next attempt is this one again, not
			// a restart.
			c.unstarted = true
			continue
		}
		if err != nil {
			if c.state.Running != nil {
				m.log.Warn("attach to shim failed", "pod", p.key(), "container", c.spec.GetName(), "err", err)
				now := time.Now()
				c.state = containerState{Terminated: &terminated{ExitCode: 255, Reason: "ExitStatusUnknown", Message: "shim state lost: " + err.Error(),
					StartedAt: c.state.Running.StartedAt, FinishedAt: now, ContainerID: c.containerID}}
			}
			continue
		}
		// A waiting container only had a live attempt if the daemon died
		// between starting it and recording that; a running one is adopted
		// either way (a dead shim's Wait answers with the recorded exit).
		if c.state.Waiting != nil && !alive {
			continue
		}
		c.proc = proc
		if c.state.Running == nil {
			c.state = containerState{Running: &running{StartedAt: proc.StartedAt()}}
			if c.spec.GetLifecycle().GetPostStart() == nil {
				// The daemon died before it recorded the start, so before
				// it announced it (with a postStart hook the container
				// stays Waiting after Started: it may have).
				name := c.spec.GetName()
				p.event(runtimev1.EventType_EVENT_TYPE_NORMAL, "Created", name, "Created container "+name)
				p.event(runtimev1.EventType_EVENT_TYPE_NORMAL, "Started", name, "Started container "+name)
			}
		}
		if alive {
			nRunning++
		}
	}
	return p, nRunning, nil
}

// status builds the API status.
func (p *managedPod) status() *runtimev1.PodStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statusLocked()
}

func (p *managedPod) statusLocked() *runtimev1.PodStatus {
	st := &runtimev1.PodStatus{Uid: p.uid, Namespace: p.spec.GetNamespace(), Name: p.spec.GetName(),
		Terminating: p.terminating, Revision: p.revision, PodIp: p.net.IP}
	if !p.startTime.IsZero() {
		st.StartTime = timestamppb.New(p.startTime)
	}
	for _, c := range p.init {
		st.InitContainerStatuses = append(st.InitContainerStatuses, c.apiStatus())
	}
	// Initialized: every init container succeeded and every native sidecar
	// started (once the main containers ran, a restarting sidecar does not
	// take it back).
	mainRan := false
	for _, c := range p.main {
		mainRan = mainRan || c.hasRun
	}
	st.Initialized = true
	var sidecars []bool
	for i, c := range p.init {
		sidecars = append(sidecars, c.sidecar())
		if c.sidecar() {
			if !mainRan && !st.InitContainerStatuses[i].GetStarted() {
				st.Initialized = false
			}
			continue
		}
		if !c.succeeded() {
			st.Initialized = false
		}
	}
	st.ContainersReady = true
	for i, c := range p.init {
		if c.sidecar() && !st.InitContainerStatuses[i].GetReady() {
			st.ContainersReady = false
		}
	}
	for _, c := range p.main {
		cs := c.apiStatus()
		if !st.Initialized {
			cs.Ready = false
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
		if !cs.Ready {
			st.ContainersReady = false
		}
	}
	for _, c := range p.ephemeral {
		st.EphemeralContainerStatuses = append(st.EphemeralContainerStatuses, c.apiStatus())
	}
	st.Phase = computePhase(p.spec.GetRestartPolicy(), st.InitContainerStatuses, st.ContainerStatuses, sidecars, mainRan)
	if p.evicted != "" {
		// Failed once every container stopped, as the kubelet reports it.
		st.Reason, st.Message = "Evicted", p.evicted
		if !slices.ContainsFunc(p.all(), func(c *container) bool { return c.state.Running != nil }) {
			st.Phase = runtimev1.PodPhase_POD_PHASE_FAILED
		}
	}
	return st
}

func termProto(t *terminated) *runtimev1.ContainerState {
	return &runtimev1.ContainerState{State: &runtimev1.ContainerState_Terminated{Terminated: &runtimev1.ContainerStateTerminated{
		ExitCode: int32(t.ExitCode), Signal: int32(t.Signal), Reason: t.Reason, Message: t.Message,
		StartedAt: timestamppb.New(t.StartedAt), FinishedAt: timestamppb.New(t.FinishedAt), ContainerId: t.ContainerID}}}
}

func (c *container) apiStatus() *runtimev1.ContainerStatus {
	cs := &runtimev1.ContainerStatus{Name: c.spec.GetName(), RestartCount: c.restartCount, Image: c.spec.GetImage(),
		ImageId: c.imageID, ImageDigest: c.imageDigest, ContainerId: c.containerID}
	if c.imageDigest == "" && c.spec.GetImage() == NativeImage {
		cs.ImageId = NativeImage
	}
	switch {
	case c.state.Running != nil:
		cs.State = &runtimev1.ContainerState{State: &runtimev1.ContainerState_Running{Running: &runtimev1.ContainerStateRunning{
			StartedAt: timestamppb.New(c.state.Running.StartedAt)}}}
		// Started once postStart completed and the startup probe passed;
		// ready while the readiness probe passes (regular init containers
		// and ephemeral containers are never ready).
		cs.Started = c.probeStarted
		cs.Ready = c.probeStarted && c.probeReady && (!c.init || c.sidecar()) && !c.ephemeral
	case c.state.Terminated != nil:
		cs.State = termProto(c.state.Terminated)
	default:
		w := c.state.Waiting
		if w == nil {
			w = &waiting{Reason: "ContainerCreating"}
		}
		cs.State = &runtimev1.ContainerState{State: &runtimev1.ContainerState_Waiting{Waiting: &runtimev1.ContainerStateWaiting{Reason: w.Reason, Message: w.Message}}}
	}
	if c.last != nil {
		cs.LastTerminationState = termProto(c.last)
	}
	return cs
}

// changedNotify persists and publishes a change.
func (p *managedPod) changedNotify() {
	p.mu.Lock()
	p.revision++
	b, seq, err := p.snapshotLocked()
	p.mu.Unlock()
	p.m.hub.changed(p.uid)
	if err == nil {
		err = p.write(b, seq, true)
	}
	if err != nil && !os.IsNotExist(err) {
		p.m.log.Error("persist pod state", "pod", p.key(), "err", err)
	}
}

// update applies f to the container under the pod lock, then publishes.
func (p *managedPod) update(f func()) {
	p.mu.Lock()
	f()
	p.mu.Unlock()
	p.changedNotify()
}

func (p *managedPod) event(t runtimev1.EventType, reason, container, msg string) {
	p.m.hub.emit(&runtimev1.PodEvent{PodUid: p.uid, Namespace: p.namespace, Name: p.name,
		Type: t, Reason: reason, Message: msg, Container: container})
}
