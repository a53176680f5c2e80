package e2e

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
)

// A server run in a mount namespace of its own (as under `ip netns exec`,
// or a unit with PrivateMounts=/ProtectSystem=) loses netd's namespace
// pins when it stops: they are bind mounts in that namespace. Restarted
// in a new one, it pins each running pod's own namespace again, so the
// pods keep serving on their addresses without a restart; and where a
// pod's namespace cannot be found again (its veth was removed meanwhile)
// the pod is not left cut off: an Event says so and the container is
// restarted into the pod's network.
func TestPodNetworkPrivateMountNS(t *testing.T) {
	requirePodNetwork(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux)")
	}
	imgs := buildImages(t)
	s := newServer(t)
	s.wrap = []string{"unshare", "--mount", "--propagation", "private", "--"}
	s.start()
	c := s.client()
	s.deletePodsAtCleanup(t)

	p := nativePod("pinned", imgs.prog, "serve:8080", "forever")
	// Cut off from its address, the pod would fail this and be restarted.
	p.Spec.Containers[0].LivenessProbe = &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 2,
		ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}}
	s.createPod(t, p)
	pod := waitPod(t, c, "pinned", 2*time.Minute, hasIP)
	ip := pod.Status.PodIP
	serving := func(what string) {
		t.Helper()
		waitFor(t, 30*time.Second, "pod serving on "+ip+" after "+what, func() error {
			out, err := dialRead(net.JoinHostPort(ip, "8080"))
			if err != nil || !strings.Contains(out, "to "+ip+":8080") {
				return fmt.Errorf("%v %q", err, out)
			}
			return nil
		})
		if out, err := s.kubectl("exec", "pinned", "--", "prog", "dial:127.0.0.1:8080"); err != nil || !strings.HasPrefix(out, "from 127.0.0.1:") {
			t.Fatalf("after %s: exec in the pod's network: %v %q", what, err, out)
		}
	}
	restarts := func() int32 {
		t.Helper()
		p := waitPod(t, c, "pinned", time.Minute, hasIP)
		if p.Status.PodIP != ip {
			t.Fatalf("pod IP %s, had %s", p.Status.PodIP, ip)
		}
		return p.Status.ContainerStatuses[0].RestartCount
	}
	serving("start")

	t.Run("pins are recovered from the live pod", func(t *testing.T) {
		s.stop()
		s.start()
		c = s.client()
		serving("a restart in a new mount namespace")
		time.Sleep(4 * time.Second) // the liveness probe's failures would show by now
		if n := restarts(); n != 0 {
			t.Fatalf("the pod was restarted %d times: it had lost its network", n)
		}
		if n := eventCounts(t, c)["pinned/SandboxChanged"]; n != 0 {
			t.Fatalf("the recovered pod was reported as changed (%d SandboxChanged Events)", n)
		}
	})

	t.Run("an unrecoverable namespace surfaces and the pod is restarted into its network", func(t *testing.T) {
		s.stop()
		// Nothing ties the pod's namespace to it once its veth is gone.
		if out, err := exec.Command("ip", "link", "del", dataplane.HostIfName(string(pod.UID))).CombinedOutput(); err != nil {
			t.Fatalf("ip link del: %v %s", err, out)
		}
		s.start()
		c = s.client()
		waitFor(t, time.Minute, "a SandboxChanged Event", func() error {
			if eventCounts(t, c)["pinned/SandboxChanged"] == 0 {
				return fmt.Errorf("none yet")
			}
			return nil
		})
		waitFor(t, time.Minute, "the container restarted once", func() error {
			if n := restarts(); n != 1 {
				return fmt.Errorf("restartCount %d", n)
			}
			return nil
		})
		serving("the restart into the pod's network")
	})
	s.deleteAllPods(t)
}
