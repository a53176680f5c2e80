package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// SIGTERM to a server running 20 pods, one of them being deleted (its
// process ignores SIGTERM, grace 20s: longer than the 15s the supervisor
// gives a component to stop, which is what killed runtimed before, as it
// waited for that grace period): every component stops at once, none is
// killed, and the pods keep
// running; the deleted pod's process still dies when its grace period
// ends, with no server left (the shim holds the deadline), so a deleted
// pod's processes never outlive the delete whatever the server does next.
func TestServerStopWithPods(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.defaultAddrs = true
	s.start()
	c := s.client()
	ip0 := nodeInternalIP(t, c, time.Time{})
	s.deletePodsAtCleanup(t)
	tmp := t.TempDir()
	const n = 20
	for i := 0; i < n; i++ {
		s.createPod(t, nativePod(fmt.Sprintf("p%02d", i), imgs.prog, "forever"))
	}
	doomed := nativePod("doomed", imgs.prog, "pid:"+filepath.Join(tmp, "doomed.pid"), "ignore", "forever")
	grace := int64(20)
	doomed.Spec.TerminationGracePeriodSeconds = &grace
	s.createPod(t, doomed)
	for i := 0; i < n; i++ {
		waitPod(t, c, fmt.Sprintf("p%02d", i), 3*time.Minute, running)
	}
	waitPod(t, c, "doomed", time.Minute, running)
	pid := readPid(t, filepath.Join(tmp, "doomed.pid"))
	before := len(s.workloadPids())

	t0 := time.Now()
	if err := c.CoreV1().Pods("default").Delete(ctx(t), "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the delete reaching the pod (Killing Event)", func() error {
		if eventCounts(t, c)["doomed/Killing"] == 0 {
			return fmt.Errorf("no Killing Event")
		}
		return nil
	})
	stopped := time.Now()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.waitErr:
	case <-time.After(time.Minute):
		t.Fatal("server did not stop within 1m")
	}
	took := time.Since(stopped)
	t.Logf("server stopped %s after SIGTERM with %d pods running", took.Round(time.Millisecond), n)
	if strings.Contains(s.output(), "did not stop in time") {
		t.Errorf("a component was killed at stop:\n%s", grepLines(s.output(), "did not stop in time"))
	}
	if took > 8*time.Second {
		t.Errorf("stopping took %s", took)
	}
	if !processAlive(pid) {
		t.Fatalf("the deleted pod's process died before its %ds grace period ended (%s after the delete)", grace, time.Since(t0))
	}
	// Not poll: this times the kill, which the check below reports on (Errorf).
	for processAlive(pid) && time.Since(t0) < time.Duration(grace+10)*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	if processAlive(pid) || time.Since(t0) > time.Duration(grace+3)*time.Second {
		t.Errorf("the deleted pod's process outlived its grace period: alive %v %s after the delete", processAlive(pid), time.Since(t0))
	}
	if after := len(s.workloadPids()); after != before-1 {
		t.Errorf("%d pod processes before the stop, %d after: the other pods must keep running", before, after)
	}
	// The node's address is chosen by one rule on every start: the bridge
	// and veths the pods keep after the stop do not change it (it was
	// 127.0.0.1 on the first start and 100.64.0.1, the bridge's, after).
	restarted := time.Now()
	s.start() // the cleanup deletes the pods through the server
	if ip := nodeInternalIP(t, s.client(), restarted); ip != ip0 {
		t.Errorf("the node's InternalIP changed across a restart: %s, then %s", ip0, ip)
	}
	s.deleteAllPods(t)
}

// deleteAllPods deletes every pod in default through the running server
// and waits for their processes to go (a test that restarted its server
// cannot leave that to deletePodsAtCleanup: its last stop runs first).
func (s *server) deleteAllPods(t *testing.T) {
	t.Helper()
	zero := int64(0)
	if err := s.client().CoreV1().Pods("default").DeleteCollection(ctx(t), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the pods' processes gone", func() error {
		if n := len(s.workloadPids()); n > 0 {
			return fmt.Errorf("%d left", n)
		}
		return nil
	})
}

// nodeInternalIP is the node's InternalIP as a node process that
// reported after since (its Ready heartbeat) set it.
func nodeInternalIP(t *testing.T, c kubernetes.Interface, since time.Time) string {
	t.Helper()
	var ip string
	waitFor(t, time.Minute, "the node's InternalIP", func() error {
		n, err := c.CoreV1().Nodes().Get(ctx(t), "e2e-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		fresh := false
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue && !cond.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) {
				fresh = true
			}
		}
		if !fresh {
			return fmt.Errorf("no Ready heartbeat since %s: %v", since, n.Status.Conditions)
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
				return nil
			}
		}
		return fmt.Errorf("no InternalIP in %v", n.Status.Addresses)
	})
	return ip
}

func grepLines(out, sub string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func processAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }
