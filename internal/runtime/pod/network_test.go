package pod

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// gatedNetwork hands out one network once the test releases each Setup;
// the first failures calls fail.
type gatedNetwork struct {
	release chan struct{}
	mu      sync.Mutex
	calls   int
	fail    int
}

func (n *gatedNetwork) Setup(ctx context.Context, uid, namespace, name string) (PodNetwork, error) {
	n.mu.Lock()
	n.calls++
	call := n.calls
	n.mu.Unlock()
	select {
	case <-n.release:
	case <-ctx.Done():
		return PodNetwork{}, ctx.Err()
	}
	if call <= n.fail {
		return PodNetwork{}, errors.New("netd is not answering (test)")
	}
	return PodNetwork{IP: "100.64.0.9", NetNS: "/run/netns/k3sm-test"}, nil
}

func (n *gatedNetwork) Teardown(context.Context, string) error { return nil }
func (n *gatedNetwork) Pods(context.Context) ([]string, error) { return nil, nil }

// recordingStarter starts nothing: it hands each ProcessSpec to the test
// and returns a process that runs until signalled.
type recordingStarter struct{ specs chan ProcessSpec }

func (s *recordingStarter) Start(_ context.Context, spec ProcessSpec) (Process, error) {
	s.specs <- spec
	return &idleProcess{started: time.Now(), done: make(chan struct{})}, nil
}

func (s *recordingStarter) Attach(string) (Process, bool, error) { return nil, false, ErrNotStarted }

type idleProcess struct {
	started time.Time
	once    sync.Once
	done    chan struct{}
}

func (p *idleProcess) Pid() int             { return 1 << 22 }
func (p *idleProcess) StartedAt() time.Time { return p.started }
func (p *idleProcess) Signal(syscall.Signal) error {
	p.once.Do(func() { close(p.done) })
	return nil
}
func (p *idleProcess) Wait(ctx context.Context) (ExitStatus, error) {
	select {
	case <-p.done:
		return ExitStatus{ExitCode: 137, Signal: 9, StartedAt: p.started, FinishedAt: time.Now()}, nil
	case <-ctx.Done():
		return ExitStatus{}, ctx.Err()
	}
}

type noImages struct{}

func (noImages) Lookup(string) (*image.Image, bool) { return nil, false }
func (noImages) Get(string) (*image.Image, bool)    { return nil, false }
func (noImages) Pull(context.Context, string, [][]byte) (*image.Image, error) {
	return nil, errors.New("no registry in this test")
}

// The network is set up beside the container's ContainerCreating record,
// and the container starts only once it is up, in the pod's namespace; a
// failed set-up is reported on the container and in an Event, and retried.
func TestContainerWaitsForThePodNetwork(t *testing.T) {
	network := &gatedNetwork{release: make(chan struct{}), fail: 1}
	starter := &recordingStarter{specs: make(chan ProcessSpec, 1)}
	m, err := NewManager(Config{DataDir: t.TempDir(), Images: noImages{}, Starter: starter, Network: network, DisableSandbox: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		m.Wait()
	}()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	sub := m.Subscribe(m.BootID(), 0)
	defer sub.Close()
	spec := &runtimev1.PodSpec{Uid: "u-net", Name: "web", Namespace: "default",
		Containers: []*runtimev1.ContainerSpec{{Name: "main", Image: NativeImage, Command: []string{"/bin/sleep"}, Args: []string{"60"}}}}
	if _, err := m.Create(spec); err != nil {
		t.Fatal(err)
	}
	waitStatus := func(what string, cond func(*runtimev1.PodStatus) bool) *runtimev1.PodStatus {
		t.Helper()
		var st *runtimev1.PodStatus
		poll.UntilNil(t, 10*time.Second, what, func() error {
			var err error
			if st, err = m.Status("u-net"); err != nil {
				return err
			}
			if !cond(st) {
				return fmt.Errorf("status %v", st)
			}
			return nil
		})
		return st
	}
	waiting := func(st *runtimev1.PodStatus) *runtimev1.ContainerStateWaiting {
		if len(st.GetContainerStatuses()) != 1 {
			return nil
		}
		return st.GetContainerStatuses()[0].GetState().GetWaiting()
	}
	// The attempt is recorded while netd still works on the network.
	waitStatus("attempt recorded", func(st *runtimev1.PodStatus) bool { return st.GetContainerStatuses()[0].GetContainerId() != "" })
	select {
	case s := <-starter.specs:
		t.Fatalf("container started before its network was set up: %+v", s)
	case <-time.After(100 * time.Millisecond):
	}
	// The first set-up fails: said on the container and in an Event.
	network.release <- struct{}{}
	waitStatus("set-up failure on the container", func(st *runtimev1.PodStatus) bool {
		w := waiting(st)
		return w != nil && w.GetReason() == "ContainerCreating" && strings.Contains(w.GetMessage(), "Failed to create pod sandbox: netd is not answering")
	})
	deadline := time.After(5 * time.Second)
	for found := false; !found; {
		select {
		case <-sub.C():
		case <-deadline:
			t.Fatal("no FailedCreatePodSandBox event")
		}
		_, _, events := sub.Take()
		for _, e := range events {
			found = found || e.GetReason() == "FailedCreatePodSandBox"
		}
	}
	select {
	case s := <-starter.specs:
		t.Fatalf("container started without a network: %+v", s)
	default:
	}
	// The retry succeeds: the container starts in the pod's namespace.
	close(network.release)
	select {
	case s := <-starter.specs:
		if s.NetNS != "/run/netns/k3sm-test" {
			t.Fatalf("started in network namespace %q", s.NetNS)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("container not started once the network was up")
	}
	st := waitStatus("running with the pod's address", func(st *runtimev1.PodStatus) bool {
		return st.GetContainerStatuses()[0].GetState().GetRunning() != nil && st.GetPodIp() == "100.64.0.9"
	})
	if c := st.GetContainerStatuses()[0]; c.GetRestartCount() != 0 {
		t.Fatalf("restartCount %d after waiting for the network", c.GetRestartCount())
	}
}
