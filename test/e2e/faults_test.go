package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/supervisor"
)

// eventCounts counts the Events of the default namespace per pod and reason
// (an aggregated Event counts as many as its count says).
func eventCounts(t *testing.T, c kubernetes.Interface) map[string]int32 {
	t.Helper()
	list, err := c.CoreV1().Events("default").List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int32{}
	for _, e := range list.Items {
		n := e.Count
		if n == 0 {
			n = 1
		}
		out[e.InvolvedObject.Name+"/"+e.Reason] += n
	}
	return out
}

// settledEvents waits until the Events stop changing for a few seconds and
// returns their counts.
func settledEvents(t *testing.T, c kubernetes.Interface) map[string]int32 {
	t.Helper()
	last := eventCounts(t, c)
	stable := time.Now()
	// Not poll: this waits for 5 s without a change, with no time-out.
	for time.Since(stable) < 5*time.Second {
		time.Sleep(time.Second)
		now := eventCounts(t, c)
		if fmt.Sprint(now) != fmt.Sprint(last) {
			last, stable = now, time.Now()
		}
	}
	return last
}

// shims counts this server's k3sm-shim processes.
func (s *server) shims() int {
	n := 0
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if filepath.Base(exe) == "k3sm-shim" && strings.Contains(string(cmdline), s.dataDir) {
			if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && strings.Contains(string(stat), ") Z ") {
				continue
			}
			n++
		}
	}
	return n
}

// oneChild returns the pid of the server's only child running role.
func (s *server) oneChild(t *testing.T, role string) int {
	t.Helper()
	pids := s.childPids(role)
	if len(pids) != 1 {
		t.Fatalf("want one %s child, found %v", role, pids)
	}
	return pids[0]
}

// waitRestarted waits for the supervisor to run a new child of role.
func (s *server) waitRestarted(t *testing.T, role string, old int) int {
	t.Helper()
	var pid int
	waitFor(t, 2*time.Minute, role+" restarted", func() error {
		now := s.childPids(role)
		if len(now) != 1 || now[0] == old {
			return fmt.Errorf("%s children %v (killed %d)", role, now, old)
		}
		pid = now[0]
		return nil
	})
	return pid
}

// diffEvents lists the Events posted again: a reason of a pod seen before
// whose count grew (a reason new to a pod is not a duplicate).
func diffEvents(before, after map[string]int32) []string {
	var out []string
	for k, n := range after {
		if before[k] > 0 && n != before[k] {
			out = append(out, fmt.Sprintf("%s: %d -> %d", k, before[k], n))
		}
	}
	sort.Strings(out)
	return out
}

// TestFaultNodeKilled: kill -9 of the node process alone. Pods keep running
// (same process, restartCount unchanged), the restarted node re-posts no old
// Event, and a status change that happened while it was down shows within
// 10 s of it being back.
func TestFaultNodeKilled(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	s.createPod(t, nativePod("long", imgs.prog))
	short := nativePod("short", imgs.prog, "sleep:8s", "exit:0")
	short.Spec.RestartPolicy = corev1.RestartPolicyNever
	s.createPod(t, short)
	waitPod(t, c, "long", 2*time.Minute, running)
	waitPod(t, c, "short", 2*time.Minute, running)
	pids := s.workloadPids()
	if len(pids) != 2 {
		t.Fatalf("workload processes %v", pids)
	}
	// Every Event of the starts is posted (the recorder sends them
	// asynchronously) before the node is killed.
	before := settledEvents(t, c)
	node := s.oneChild(t, "node")
	if err := syscall.Kill(node, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.waitRestarted(t, "node", node)
	// The new process has registered once the Node's lease is renewed by it;
	// give it the time to start, then 10 s for the status.
	var back time.Time
	waitFor(t, 2*time.Minute, "restarted node registered", func() error {
		if strings.Count(s.nodeLog(t), "node registered") < 2 {
			return fmt.Errorf("no second \"node registered\" in the node log")
		}
		back = time.Now()
		return nil
	})
	waitPod(t, c, "short", 10*time.Second, func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	t.Logf("short pod Succeeded %s after the node was back", time.Since(back).Round(time.Millisecond))
	p := waitPod(t, c, "long", 10*time.Second, running)
	if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 {
		t.Fatalf("restartCount %d after the node was killed", rc)
	}
	if syscall.Kill(pids[0], 0) != nil && syscall.Kill(pids[1], 0) != nil {
		t.Fatal("workload died with the node")
	}
	if now := s.workloadPids(); len(now) != 1 || (now[0] != pids[0] && now[0] != pids[1]) {
		t.Fatalf("workload processes %v, want one of %v", now, pids)
	}
	after := settledEvents(t, c)
	if d := diffEvents(before, after); len(d) != 0 {
		t.Fatalf("Events changed after the node restarted:\n%s", strings.Join(d, "\n"))
	}
}

// TestFaultNodeKilledRepeatedly: 20 kill -9 in a row of the node in a
// running (settled) server, each once the new process is ready, when the
// supervisor tells it it settled: the moment its signal used to kill a
// child before it had a handler. Every restart is of one of the test's
// kills, none of a signal of the supervisor's, and the node then serves
// its pod as before.
func TestFaultNodeKilledRepeatedly(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	// 20 kills in a row would otherwise wait up to 30 s for each restart.
	s.env = append(s.env, supervisor.RestartMaxDelayEnv+"=1s")
	s.start()
	c := s.client()
	s.createPod(t, nativePod("long", imgs.prog))
	waitPod(t, c, "long", 2*time.Minute, running)
	states := filepath.Join(s.dataDir, "run", "components.json")
	nodeState := func() supervisor.ChildState {
		st, _ := supervisor.ReadState(states)
		for _, ch := range st.Children {
			if ch.Name == "node" {
				return ch
			}
		}
		return supervisor.ChildState{}
	}
	const kills = 20
	node := s.oneChild(t, "node")
	var logged int // the node log's length before the last kill
	for i := 0; i < kills; i++ {
		logged = len(s.nodeLog(t))
		if err := syscall.Kill(node, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: %v", i+1, err)
		}
		node = s.waitRestarted(t, "node", node)
		waitFor(t, time.Minute, fmt.Sprintf("the node ready after kill %d", i+1), func() error {
			if st := nodeState(); st.Pid != node || !st.Live {
				return fmt.Errorf("node state %+v (pid %d)", st, node)
			}
			return nil
		})
		// The settle byte is written as the child turns ready; a killed
		// child would be gone (and replaced) within this pause.
		time.Sleep(300 * time.Millisecond)
		if syscall.Kill(node, 0) != nil {
			t.Fatalf("the node (pid %d) died on its own after kill %d; supervisor log:\n%s", node, i+1, s.output())
		}
	}
	if st := nodeState(); st.Restarts != kills || st.LastExit != "killed by signal killed" {
		t.Errorf("node state after %d kills: %+v", kills, st)
	}
	var exits []string
	for _, line := range strings.Split(s.output(), "\n") {
		if strings.Contains(line, "component exited; restarting") && strings.Contains(line, "component=node") {
			exits = append(exits, line)
			if !strings.Contains(line, `status="killed by signal killed"`) {
				t.Errorf("a node exit not of the test's SIGKILL: %s", line)
			}
		}
	}
	if len(exits) != kills {
		t.Errorf("%d node exits logged, want %d:\n%s", len(exits), kills, strings.Join(exits, "\n"))
	}
	// A process killed once ready may not have registered yet: the last
	// one must.
	waitFor(t, time.Minute, "the node registered again", func() error {
		if !strings.Contains(s.nodeLog(t)[logged:], "node registered") {
			return fmt.Errorf("no \"node registered\" in the node log since the last kill")
		}
		return nil
	})
	p := waitPod(t, c, "long", 30*time.Second, running)
	if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 {
		t.Errorf("restartCount %d after %d kills of the node", rc, kills)
	}
	if out, err := s.kubectl("exec", "long", "--", "prog", "echo:alive"); err != nil || !strings.Contains(out, "alive") {
		t.Errorf("kubectl exec after the kills: %v: %q", err, out)
	}
}

// nodeLog is the supervised node's log file.
func (s *server) nodeLog(t *testing.T) string {
	t.Helper()
	data, _ := os.ReadFile(filepath.Join(s.dataDir, "logs", "node.log"))
	return string(data)
}

// TestFaultAPIServerUnreachable: the apiserver stops answering for 30 s
// while pods start and exit; once it is back every pod's status is right
// within 30 s.
func TestFaultAPIServerUnreachable(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	const n = 3
	for i := range n {
		s.createPod(t, nativePod(fmt.Sprintf("run-%d", i), imgs.prog))
		quick := nativePod(fmt.Sprintf("quick-%d", i), imgs.prog, "sleep:20s", "exit:0")
		quick.Spec.RestartPolicy = corev1.RestartPolicyNever
		s.createPod(t, quick)
		fail := nativePod(fmt.Sprintf("fail-%d", i), imgs.prog, "sleep:22s", "exit:3")
		fail.Spec.RestartPolicy = corev1.RestartPolicyNever
		s.createPod(t, fail)
	}
	// Stop the apiserver once they all run: the quick and fail pods exit
	// while it is stopped. Pods created just before it stops ("late") start
	// meanwhile or after.
	waitFor(t, 2*time.Minute, "pods running", func() error {
		list, err := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodPending || p.Status.Phase == "" {
				return fmt.Errorf("%s: %s", p.Name, p.Status.Phase)
			}
		}
		if len(list.Items) != 3*n {
			return fmt.Errorf("%d pods", len(list.Items))
		}
		return nil
	})
	for i := range n {
		s.createPod(t, nativePod(fmt.Sprintf("late-%d", i), imgs.prog))
	}
	waitFor(t, time.Minute, "late pods bound", func() error {
		for i := range n {
			p, err := c.CoreV1().Pods("default").Get(ctx(t), fmt.Sprintf("late-%d", i), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Spec.NodeName == "" {
				return fmt.Errorf("%s not bound", p.Name)
			}
		}
		return nil
	})
	api := s.oneChild(t, "kube-apiserver")
	if err := syscall.Kill(api, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { syscall.Kill(api, syscall.SIGCONT) })
	time.Sleep(30 * time.Second)
	if err := syscall.Kill(api, syscall.SIGCONT); err != nil {
		t.Logf("apiserver gone meanwhile (%v): the supervisor restarts it", err)
	}
	t.Logf("apiserver stopped for %s", time.Since(stopped).Round(time.Second))
	back := time.Now()
	waitFor(t, 2*time.Minute, "API answering", func() error {
		_, err := c.CoreV1().Namespaces().Get(ctx(t), "default", metav1.GetOptions{})
		return err
	})
	t.Logf("API answered %s after SIGCONT", time.Since(back).Round(time.Millisecond))
	back = time.Now()
	want := func(p *corev1.Pod) error {
		switch {
		case strings.HasPrefix(p.Name, "run-"), strings.HasPrefix(p.Name, "late-"):
			if err := running(p); err != nil {
				return err
			}
			if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Running == nil || !p.Status.ContainerStatuses[0].Ready {
				return fmt.Errorf("container %+v", p.Status.ContainerStatuses)
			}
		case strings.HasPrefix(p.Name, "quick-"):
			if p.Status.Phase != corev1.PodSucceeded {
				return fmt.Errorf("phase %s", p.Status.Phase)
			}
		case strings.HasPrefix(p.Name, "fail-"):
			if p.Status.Phase != corev1.PodFailed {
				return fmt.Errorf("phase %s", p.Status.Phase)
			}
			if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].State.Terminated.ExitCode != 3 {
				return fmt.Errorf("container %+v", cs)
			}
		}
		return nil
	}
	waitFor(t, 30*time.Second, "every pod's status right", func() error {
		list, err := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for i := range list.Items {
			if err := want(&list.Items[i]); err != nil {
				return fmt.Errorf("%s: %w", list.Items[i].Name, err)
			}
		}
		return nil
	})
	t.Logf("statuses right %s after the API answered", time.Since(back).Round(time.Millisecond))
	for i := range n {
		p, err := c.CoreV1().Pods("default").Get(ctx(t), fmt.Sprintf("run-%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 {
			t.Fatalf("%s restartCount %d", p.Name, rc)
		}
		p, err = c.CoreV1().Pods("default").Get(ctx(t), fmt.Sprintf("late-%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 {
			t.Fatalf("%s restartCount %d", p.Name, rc)
		}
	}
}

// TestFaultRuntimedKilledDuringBurst: runtimed is SIGKILLed while 50 pods
// start; every pod ends Running exactly once.
func TestFaultRuntimedKilledDuringBurst(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	// Pull the image first, so the burst is about starting pods.
	s.createPod(t, nativePod("warm", imgs.prog))
	waitPod(t, c, "warm", 2*time.Minute, running)
	s.deletePod(t, "warm", 0)
	const n = 50
	rt := s.oneChild(t, "runtimed")
	// Kill it as soon as the first burst pod runs, while the others are
	// still being created and started.
	killed := make(chan int, 1)
	go func() {
		// Not poll: this runs beside the creates, where a test cannot
		// fail, and kills on time-out too.
		deadline := time.Now().Add(2 * time.Minute)
		for len(s.workloadPids()) < 1 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		r := len(s.workloadPids())
		syscall.Kill(rt, syscall.SIGKILL)
		killed <- r
	}()
	for i := range n {
		p := nativePod(fmt.Sprintf("burst-%02d", i), imgs.prog)
		p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
		s.createPod(t, p)
	}
	t.Logf("%d of %d processes running when runtimed was killed", <-killed, n)
	s.waitRestarted(t, "runtimed", rt)
	waitFor(t, 5*time.Minute, "all burst pods running", func() error {
		list, err := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return err
		}
		r := 0
		var not []string
		for _, p := range list.Items {
			if running(&p) == nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready {
				r++
			} else if len(not) < 5 {
				not = append(not, fmt.Sprintf("%s %s %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses))
			}
		}
		if r != n {
			return fmt.Errorf("%d of %d running; e.g. %v", r, n, not)
		}
		return nil
	})
	list, err := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 {
			t.Errorf("%s restartCount %d", p.Name, rc)
		}
	}
	// At most one Started event per pod, never a duplicate. Not exactly
	// one: runtimed keeps its event buffer in memory, and a Started it
	// emitted just before the SIGKILL, not yet received by the node, is
	// gone with it (Kubernetes Events are best-effort: a kubelet that
	// crashes loses them too). An attempt the new runtimed adopts before
	// the old one recorded it started gets its Started from the new one.
	// The restartCount, process and shim checks are what "exactly once"
	// means.
	events := settledEvents(t, c)
	for i := range n {
		name := fmt.Sprintf("burst-%02d", i)
		if got := events[name+"/Started"]; got > 1 {
			t.Errorf("%s: %d Started events", name, got)
		}
	}
	if got := len(s.workloadPids()); got != n {
		t.Errorf("%d workload processes, want %d", got, n)
	}
	if got := s.shims(); got != n {
		t.Errorf("%d shims, want %d", got, n)
	}
}
