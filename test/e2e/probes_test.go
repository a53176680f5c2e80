package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// fast is a probe every second that flips after one result.
func fast(h corev1.ProbeHandler) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: h, PeriodSeconds: 1, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1}
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

func ctrStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, l := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range l {
			if l[i].Name == name {
				return &l[i]
			}
		}
	}
	return nil
}

// waitEvent waits for an Event of the pod with reason and a message
// containing substr.
func waitEvent(t *testing.T, c kubernetes.Interface, pod, reason, substr string) corev1.Event {
	t.Helper()
	var found corev1.Event
	waitFor(t, time.Minute, fmt.Sprintf("%s event %q of %s", reason, substr, pod), func() error {
		evs, err := c.CoreV1().Events("default").List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Reason == reason && strings.Contains(e.Message, substr) {
				found = e
				return nil
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return fmt.Errorf("events: %v", seen)
	})
	return found
}

func lines(path string) string {
	b, _ := os.ReadFile(path)
	return strings.Join(strings.Fields(string(b)), " ")
}

func TestProbesHooksSidecars(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	create, del := s.createPod, s.deletePod

	// Readiness with each probe kind drives the Ready condition; each kind
	// fails as specified (Unhealthy events with the kubelet's words).
	t.Run("readiness probes of each kind", func(t *testing.T) {
		dir := t.TempDir()
		flag, tcpFlag := filepath.Join(dir, "fail"), filepath.Join(dir, "tcpfail")
		httpPort, tcpPort := freePort(t), freePort(t)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs, hs := grpc.NewServer(), health.NewServer()
		healthpb.RegisterHealthServer(gs, hs)
		go gs.Serve(l)
		defer gs.Stop()
		grpcPort := l.Addr().(*net.TCPAddr).Port
		p := nativePod("ready", imgs.prog)
		// The gRPC health server runs in the test, on the node's loopback:
		// the pod shares the node's network to reach it (probes of pods
		// with their own network: TestPodNetwork).
		p.Spec.HostNetwork = true
		p.Spec.Containers = []corev1.Container{
			{Name: "exec", Image: imgs.prog, Args: []string{"forever"},
				ReadinessProbe: fast(corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/app/prog", "absent:" + flag}}})},
			{Name: "http", Image: imgs.prog, Args: []string{"http:" + strconv.Itoa(httpPort) + ":" + flag, "forever"},
				Ports:          []corev1.ContainerPort{{Name: "web", ContainerPort: int32(httpPort)}},
				ReadinessProbe: fast(corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("web")}})},
			{Name: "tcp", Image: imgs.prog, Args: []string{"tcp:" + strconv.Itoa(tcpPort) + ":" + tcpFlag, "forever"},
				ReadinessProbe: fast(corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(int32(tcpPort))}})},
			{Name: "grpc", Image: imgs.prog, Args: []string{"forever"},
				ReadinessProbe: fast(corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: int32(grpcPort)}})},
		}
		create(t, p)
		waitPod(t, c, p.Name, 2*time.Minute, func(p *corev1.Pod) error {
			if podCondition(p, corev1.PodReady) != corev1.ConditionTrue || podCondition(p, corev1.ContainersReady) != corev1.ConditionTrue {
				return fmt.Errorf("not ready: %+v", p.Status.ContainerStatuses)
			}
			return nil
		})
		os.WriteFile(flag, []byte("x"), 0o644)
		os.WriteFile(tcpFlag, []byte("x"), 0o644)
		hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		pod := waitPod(t, c, p.Name, time.Minute, func(p *corev1.Pod) error {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Ready {
					return fmt.Errorf("%s still ready", cs.Name)
				}
			}
			if podCondition(p, corev1.PodReady) != corev1.ConditionFalse {
				return fmt.Errorf("Ready %s", podCondition(p, corev1.PodReady))
			}
			return nil
		})
		if pod.Status.Phase != corev1.PodRunning {
			t.Errorf("phase %s", pod.Status.Phase)
		}
		for _, want := range []string{
			"Readiness probe failed: " + flag + " exists",
			"Readiness probe failed: HTTP probe failed with statuscode: 500",
			fmt.Sprintf("Readiness probe failed: dial tcp 127.0.0.1:%d: connect: connection refused", tcpPort),
			`Readiness probe failed: service unhealthy (responded with "NOT_SERVING")`,
		} {
			if e := waitEvent(t, c, p.Name, "Unhealthy", want); e.Type != corev1.EventTypeWarning {
				t.Errorf("event type %s", e.Type)
			}
		}
		// Recovered targets make their containers ready again.
		os.Remove(flag)
		hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		waitPod(t, c, p.Name, time.Minute, func(p *corev1.Pod) error {
			for _, n := range []string{"exec", "http", "grpc"} {
				if !ctrStatus(p, n).Ready {
					return fmt.Errorf("%s not ready", n)
				}
			}
			if ctrStatus(p, "tcp").Ready || podCondition(p, corev1.PodReady) != corev1.ConditionFalse {
				return fmt.Errorf("tcp still listening?")
			}
			return nil
		})
		del(t, p.Name, 0)
	})

	// A failing liveness probe restarts the container with the kubelet's
	// message and events.
	t.Run("liveness restarts", func(t *testing.T) {
		flag := filepath.Join(t.TempDir(), "sick")
		port := freePort(t)
		p := nativePod("live", imgs.prog, "http:"+strconv.Itoa(port)+":"+flag, "trap:0", "forever")
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "web", ContainerPort: int32(port)}}
		lp := fast(corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromString("web")}})
		lp.FailureThreshold = 2
		p.Spec.Containers[0].LivenessProbe = lp
		create(t, p)
		waitPod(t, c, p.Name, 2*time.Minute, func(p *corev1.Pod) error {
			if podCondition(p, corev1.PodReady) != corev1.ConditionTrue {
				return fmt.Errorf("not ready")
			}
			return nil
		})
		os.WriteFile(flag, []byte("x"), 0o644)
		waitEvent(t, c, p.Name, "Killing", "Container main failed liveness probe, will be restarted")
		if e := waitEvent(t, c, p.Name, "Unhealthy", "Liveness probe failed: HTTP probe failed with statuscode: 500"); e.Type != corev1.EventTypeWarning ||
			e.InvolvedObject.FieldPath != "spec.containers{main}" {
			t.Errorf("Unhealthy event %s on %q", e.Type, e.InvolvedObject.FieldPath)
		}
		os.Remove(flag)
		waitPod(t, c, p.Name, time.Minute, func(p *corev1.Pod) error {
			cs := ctrStatus(p, "main")
			if cs.RestartCount < 1 || !cs.Ready || cs.LastTerminationState.Terminated == nil {
				return fmt.Errorf("status %+v", cs)
			}
			return nil
		})
		del(t, p.Name, 0)
	})

	// The startup probe holds the container not started and not ready.
	t.Run("startup probe gates readiness", func(t *testing.T) {
		flag := filepath.Join(t.TempDir(), "starting")
		os.WriteFile(flag, []byte("x"), 0o644)
		p := nativePod("startup", imgs.prog, "forever")
		sp := fast(corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/app/prog", "absent:" + flag}}})
		sp.FailureThreshold = 120
		p.Spec.Containers[0].StartupProbe = sp
		create(t, p)
		pod := waitPod(t, c, p.Name, 2*time.Minute, running)
		waitEvent(t, c, p.Name, "Unhealthy", "Startup probe failed: "+flag+" exists")
		pod, _ = c.CoreV1().Pods("default").Get(ctx(t), p.Name, metav1.GetOptions{})
		if cs := ctrStatus(pod, "main"); cs.Ready || cs.Started == nil || *cs.Started {
			t.Fatalf("started/ready before the startup probe passed: %+v", cs)
		}
		os.Remove(flag)
		waitPod(t, c, p.Name, time.Minute, func(p *corev1.Pod) error {
			if cs := ctrStatus(p, "main"); !cs.Ready || !*cs.Started || podCondition(p, corev1.PodReady) != corev1.ConditionTrue {
				return fmt.Errorf("status %+v", cs)
			}
			return nil
		})
		del(t, p.Name, 0)
	})

	// postStart finishes before the container is Running; preStop runs
	// before SIGTERM.
	t.Run("preStop runs before SIGTERM", func(t *testing.T) {
		order := filepath.Join(t.TempDir(), "order")
		p := nativePod("hooks", imgs.prog, "onterm:"+order+":sigterm", "forever")
		p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](10)
		p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{
			PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/app/prog", "sleep:1s", "append:" + order + ":poststart"}}},
			PreStop:   &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/app/prog", "append:" + order + ":prestop"}}},
		}
		create(t, p)
		waitPod(t, c, p.Name, 2*time.Minute, running)
		if got := lines(order); got != "poststart" {
			t.Errorf("Running before postStart finished: %q", got)
		}
		del(t, p.Name, 10)
		if got := lines(order); got != "poststart prestop sigterm" {
			t.Errorf("order %q, want poststart prestop sigterm", got)
		}
	})

	t.Run("failed postStart", func(t *testing.T) {
		p := nativePod("badhook", imgs.prog, "forever")
		p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{
			PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/app/prog", "exit:3"}}}}
		create(t, p)
		waitEvent(t, c, p.Name, "FailedPostStartHook", "exited with 3")
		waitPod(t, c, p.Name, time.Minute, func(p *corev1.Pod) error {
			if cs := ctrStatus(p, "main"); cs.RestartCount < 1 || cs.State.Running != nil {
				return fmt.Errorf("status %+v", cs)
			}
			return nil
		})
		del(t, p.Name, 0)
	})

	// A native sidecar starts before the main container (after its startup
	// probe passed) and stops after it.
	t.Run("native sidecar", func(t *testing.T) {
		order := filepath.Join(t.TempDir(), "order")
		port := freePort(t)
		p := nativePod("sidecar", imgs.prog, "onterm:"+order+":main-term", "append:"+order+":main", "forever")
		sp := fast(corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(int32(port))}})
		sp.FailureThreshold = 60
		p.Spec.InitContainers = []corev1.Container{{Name: "side", Image: imgs.prog, RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
			Args:         []string{"onterm:" + order + ":side-term", "sleep:1s", "append:" + order + ":side-up", "tcp:" + strconv.Itoa(port), "forever"},
			StartupProbe: sp}}
		create(t, p)
		pod := waitPod(t, c, p.Name, 2*time.Minute, func(p *corev1.Pod) error {
			if podCondition(p, corev1.PodReady) != corev1.ConditionTrue || podCondition(p, corev1.PodInitialized) != corev1.ConditionTrue {
				return fmt.Errorf("conditions %+v", p.Status.Conditions)
			}
			return nil
		})
		if cs := ctrStatus(pod, "side"); cs.State.Running == nil || !cs.Ready {
			t.Errorf("sidecar status %+v", cs)
		}
		waitFor(t, 30*time.Second, "main started after the sidecar", func() error {
			if got := lines(order); got != "side-up main" {
				return fmt.Errorf("start order %q", got)
			}
			return nil
		})
		del(t, p.Name, 10)
		if got := lines(order); got != "side-up main main-term side-term" {
			t.Errorf("order %q, want the sidecar stopped after main", got)
		}
	})
}
