// Package pod owns the pod lifecycle as the kubelet runs it, on native
// processes: init containers one at a time, then the containers; restart
// policies with CrashLoopBackOff; image pull policies with ImagePullBackOff;
// graceful termination; phases and container states; events; and the
// on-disk state under <data>/pods/<uid>/ that lets a restarted daemon
// re-attach to the shims of running containers instead of recreating them.
package pod

// The Manager: its configuration, its start (re-attaching the pods on
// disk), and the calls that admit pods and look them up. The lifecycle
// lives in the files named for each part: worker.go, attempt.go, root.go,
// wait.go, stop.go, crashloop.go, imagepull.go, update.go, ephemeral.go,
// delete.go, state.go, persist.go, reattach.go, status.go.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/backoff"
	"github.com/k3sm-dev/k3sm/internal/datadir"

	"google.golang.org/protobuf/proto"

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
	go m.enforceDeadlines(ctx)
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
		p.init = append(p.init, m.newContainer(c, true, p.deleteCh))
	}
	for _, c := range spec.GetContainers() {
		p.main = append(p.main, m.newContainer(c, false, p.deleteCh))
	}
	for _, ec := range spec.GetEphemeralContainers() {
		p.ephemeral = append(p.ephemeral, p.newEphemeral(ec))
	}
	return p
}

// newContainer is a container of the pod, not started yet, with the
// manager's back-offs.
func (m *Manager) newContainer(c *runtimev1.ContainerSpec, init bool, deleteCh chan struct{}) *container {
	x := &container{spec: c, name: c.GetName(), init: init, wake: make(chan struct{}, 1), stopc: deleteCh,
		state:        containerState{Waiting: &waiting{Reason: "ContainerCreating"}},
		crashBackOff: backoff.Backoff{Initial: m.cfg.CrashLoopBackOffBase, Max: m.cfg.CrashLoopBackOffMax},
		pullBackOff:  backoff.Backoff{Initial: m.cfg.ImagePullBackOffBase, Max: m.cfg.ImagePullBackOffMax}}
	if x.sidecar() {
		// Native sidecars stop after the main containers: the worker
		// closes their own channel once those are gone.
		x.stopc = make(chan struct{})
	}
	return x
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
