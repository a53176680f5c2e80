package pod

// The in-memory state of a pod and its containers, as the lifecycle
// keeps it (guarded by the pod's mu).

import (
	"sync"
	"sync/atomic"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/backoff"
)

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
	// back-off, touched only by the container's goroutine: crashBackOff's
	// Delay is the wait before the next restart (CrashLoopBackOff),
	// pullBackOff's Next the wait before the next pull (ImagePullBackOff).
	crashBackOff backoff.Backoff
	pullBackOff  backoff.Backoff
}

// sidecar reports a native sidecar: an init container with restartPolicy
// Always.
func (c *container) sidecar() bool {
	return c.init && c.spec.GetRestartPolicy() == runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS
}

func (c *container) succeeded() bool {
	return c.state.Terminated != nil && c.state.Terminated.ExitCode == 0
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
	// stateGone: the pod's directory is being removed; pod.json is not
	// written again, nor its directory made again (under saveMu).
	stateGone bool

	// volMu serializes volume set-up and content updates; volReady: the
	// volumes exist on disk; volGone: the pod's directory is being removed,
	// and an update must not write into it (nor its pod.json) again.
	volMu    sync.Mutex
	volReady bool
	volGone  bool

	// evicted is the eviction message (the kubelet's "Evicted" reason): the
	// containers are stopped, the pod stays Failed until it is deleted.
	evicted string
	// failReason is the reason of the pod's Failed status that evicted
	// stands for: "" is Evicted; DeadlineExceeded for activeDeadlineSeconds.
	failReason string
	stopOnce   sync.Once
	deleteCh   chan struct{} // closed when deletion (or eviction) starts
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
