package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/k3sm-dev/k3sm/internal/runtime/pressure"
)

// memAvailable is memory.available as the node and the runtime daemon
// read it (the machine's memory less the root cgroup's working set), in
// bytes.
func memAvailable(t *testing.T) int64 {
	t.Helper()
	m, err := pressure.ReadMemory()
	if err != nil {
		t.Skipf("memory.available is not measured here: %v", err)
	}
	return int64(m.AvailableBytes)
}

// TestMemoryPressure: five pods run; the server comes back with a
// memory.available threshold 2Gi above what the machine has free, so the
// pressure is real. The node reports MemoryPressure (and is tainted), and
// the runtime evicts one pod per housekeeping in the kubelet's order: the
// BestEffort pod using the most memory first, then the higher-priority
// BestEffort pod (also above its request, though it uses more), then the
// Burstable pod (within its request, less below it), then the Guaranteed
// one; the system-node-critical pod is never evicted. Each evicted pod is
// Failed with reason Evicted and the kubelet's message, with an Evicted
// event.
func TestMemoryPressure(t *testing.T) {
	imgs := buildImages(t)
	const interval = 3 * time.Second
	s := newServer(t, "--housekeeping-interval="+interval.String(), "--eviction-pressure-transition-period=5s")
	s.start()
	c := s.client()
	if _, err := c.SchedulingV1().PriorityClasses().Create(ctx(t), &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "important"}, Value: 1000},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mem := func(req, lim string) corev1.ResourceRequirements {
		r := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(req), corev1.ResourceCPU: resource.MustParse("100m")}}
		if lim != "" {
			r.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(lim), corev1.ResourceCPU: resource.MustParse("100m")}
		}
		return r
	}
	hog := nativePod("hog", imgs.prog, "alloc:300Mi", "forever")
	important := nativePod("important", imgs.prog, "alloc:400Mi", "forever")
	important.Spec.PriorityClassName = "important"
	burstable := nativePod("burstable", imgs.prog, "forever")
	burstable.Spec.Containers[0].Resources = mem("32Mi", "")
	guaranteed := nativePod("guaranteed", imgs.prog, "forever")
	guaranteed.Spec.Containers[0].Resources = mem("64Mi", "64Mi")
	critical := nativePod("critical", imgs.prog, "alloc:100Mi", "forever")
	critical.Spec.PriorityClassName = "system-node-critical"
	pods := []*corev1.Pod{hog, important, burstable, guaranteed, critical}
	for _, p := range pods {
		s.createPod(t, p)
	}
	want := map[string]corev1.PodQOSClass{"hog": corev1.PodQOSBestEffort, "important": corev1.PodQOSBestEffort,
		"burstable": corev1.PodQOSBurstable, "guaranteed": corev1.PodQOSGuaranteed, "critical": corev1.PodQOSBestEffort}
	for _, p := range pods {
		got := waitPod(t, c, p.Name, 2*time.Minute, running)
		if got.Status.QOSClass != want[p.Name] {
			t.Fatalf("%s: QoS %s, want %s", p.Name, got.Status.QOSClass, want[p.Name])
		}
	}
	for _, name := range []string{"hog", "important", "critical"} {
		waitFor(t, time.Minute, name+" allocated", func() error {
			if out, err := s.kubectl("logs", name); err != nil || !strings.Contains(out, "allocated") {
				return fmt.Errorf("%q %v", out, err)
			}
			return nil
		})
	}
	if p, _ := c.CoreV1().Pods("default").Get(ctx(t), "critical", metav1.GetOptions{}); p.Spec.Priority == nil || *p.Spec.Priority < 2000000000 {
		t.Fatalf("critical's priority: %v", p.Spec.Priority)
	}
	// No memory threshold so far (the harness's --eviction-hard has none):
	// nothing evicted.
	if n, _ := c.CoreV1().Nodes().Get(ctx(t), "e2e-node", metav1.GetOptions{}); memoryPressure(n).Status != corev1.ConditionFalse {
		t.Fatalf("MemoryPressure before the threshold: %+v", memoryPressure(n))
	}

	// The server again (the pods keep running), with a threshold above
	// what is free: the machine is now below memory.available.
	s.stop()
	threshold := (memAvailable(t) + 2<<30) >> 20 << 20
	thresholdQ := resource.NewQuantity(threshold, resource.BinarySI).String()
	s.extra = []string{"--eviction-hard=memory.available<" + thresholdQ + ",nodefs.available<1Mi,imagefs.available<1Mi,nodefs.inodesFree<1%",
		"--housekeeping-interval=" + interval.String(), "--eviction-pressure-transition-period=5s"}
	t.Logf("threshold memory.available<%s", thresholdQ)
	s.start()
	c = s.client()
	s.deletePodsAtCleanup(t)

	waitFor(t, time.Minute, "MemoryPressure=True and the memory-pressure taint", func() error {
		n, err := c.CoreV1().Nodes().Get(ctx(t), "e2e-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cond := memoryPressure(n)
		tainted := slices.ContainsFunc(n.Spec.Taints, func(tn corev1.Taint) bool {
			return tn.Key == corev1.TaintNodeMemoryPressure && tn.Effect == corev1.TaintEffectNoSchedule
		})
		if cond.Status != corev1.ConditionTrue || cond.Reason != "KubeletHasInsufficientMemory" || cond.Message != "kubelet has insufficient memory available" || !tainted {
			return fmt.Errorf("condition %+v, taints %v", cond, n.Spec.Taints)
		}
		return nil
	})

	// Evictions as the API shows them, in order.
	order := []string{"hog", "important", "burstable", "guaranteed"}
	var seen []string
	waitFor(t, 2*time.Minute, "four pods evicted", func() error {
		list, err := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return err
		}
		var now []string
		for _, p := range list.Items {
			if p.Status.Reason == "Evicted" && !slices.Contains(seen, p.Name) {
				now = append(now, p.Name)
			}
		}
		if len(now) > 1 {
			t.Errorf("%v seen evicted in the same poll: the runtime evicts one pod per check, every %s", now, interval)
		}
		seen = append(seen, now...)
		if len(seen) < len(order) {
			return fmt.Errorf("evicted so far: %v", seen)
		}
		return nil
	})
	if !slices.Equal(seen, order) {
		t.Errorf("eviction order %v, want %v", seen, order)
	}

	// The runtime's own record: one eviction per check, a check every
	// interval.
	times := evictionTimes(t, s)
	var logged []string
	for _, e := range times {
		logged = append(logged, e.pod)
	}
	if want := []string{"default/hog", "default/important", "default/burstable", "default/guaranteed"}; !slices.Equal(logged, want) {
		t.Errorf("runtimed evicted %v, want %v", logged, want)
	}
	for _, e := range times {
		t.Logf("runtimed evicted %s at %s", e.pod, e.at.Format("15:04:05.000"))
	}
	for i := 1; i < len(times); i++ {
		if d := times[i].at.Sub(times[i-1].at); d < interval*2/3 {
			t.Errorf("%s evicted %s after %s: one pod per check (every %s)", times[i].pod, d, times[i-1].pod, interval)
		}
	}

	// Status, message and event as the kubelet writes them.
	hogMsg := regexp.MustCompile(`^The node was low on resource: memory\. Threshold quantity: ` + regexp.QuoteMeta(thresholdQ) +
		`, available: [0-9]+(Ki|Mi|Gi)\. Container main was using [0-9]+(Ki|Mi), request is 0, has larger consumption of memory\. $`)
	withinMsg := regexp.MustCompile(`^The node was low on resource: memory\. Threshold quantity: ` + regexp.QuoteMeta(thresholdQ) + `, available: [0-9]+(Ki|Mi|Gi)\. $`)
	for _, name := range order {
		p := waitPod(t, c, name, time.Minute, func(p *corev1.Pod) error {
			if p.Status.Phase != corev1.PodFailed || p.Status.Reason != "Evicted" {
				return fmt.Errorf("phase %s reason %q", p.Status.Phase, p.Status.Reason)
			}
			return nil
		})
		re := withinMsg
		if name == "hog" || name == "important" {
			re = hogMsg
		}
		t.Logf("%s: %s", name, p.Status.Message)
		if !re.MatchString(p.Status.Message) {
			t.Errorf("%s: message %q, want %s", name, p.Status.Message, re)
		}
		if name == "hog" {
			// 300Mi resident: the usage in the message is at least that.
			m := regexp.MustCompile(`was using ([0-9]+(Ki|Mi))`).FindStringSubmatch(p.Status.Message)
			if q := resource.MustParse(m[1]); q.Value() < 300<<20 {
				t.Errorf("hog was using %s, it holds 300Mi", m[1])
			}
		}
		if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Terminated == nil {
			t.Errorf("%s: container not terminated: %+v", name, cs)
		}
		disrupted := slices.ContainsFunc(p.Status.Conditions, func(pc corev1.PodCondition) bool {
			return pc.Type == corev1.DisruptionTarget && pc.Status == corev1.ConditionTrue && pc.Reason == "TerminationByKubelet"
		})
		if !disrupted {
			t.Errorf("%s: no DisruptionTarget condition: %+v", name, p.Status.Conditions)
		}
		waitFor(t, 30*time.Second, name+"'s Evicted event", func() error {
			ev, err := c.CoreV1().Events("default").List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=Evicted"})
			if err != nil {
				return err
			}
			for _, e := range ev.Items {
				if e.Type == corev1.EventTypeWarning && e.Message == p.Status.Message && e.Source.Component == "kubelet" {
					return nil
				}
			}
			return fmt.Errorf("events %+v", ev.Items)
		})
	}

	// The critical pod stays through more checks, under pressure still.
	time.Sleep(3 * interval)
	if p := waitPod(t, c, "critical", time.Second, running); p.Status.Reason != "" || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("critical: %+v", p.Status)
	}
	if n, _ := c.CoreV1().Nodes().Get(ctx(t), "e2e-node", metav1.GetOptions{}); memoryPressure(n).Status != corev1.ConditionTrue {
		t.Errorf("MemoryPressure cleared though memory.available is still below %s", thresholdQ)
	}
	if log := runtimedLog(t, s); !strings.Contains(log, "cannot evict a critical pod") || !strings.Contains(log, "pod=default/critical") {
		t.Errorf("runtimed did not say it kept the critical pod")
	}
	if out, err := s.kubectl("get", "events", "--field-selector", "involvedObject.kind=Node", "-o", "custom-columns=R:.reason,M:.message", "--no-headers"); err != nil ||
		!strings.Contains(out, "Attempting to reclaim memory") || !strings.Contains(out, "NodeHasInsufficientMemory") {
		t.Errorf("node events: %q %v", out, err)
	}
}

func memoryPressure(n *corev1.Node) corev1.NodeCondition {
	if n == nil {
		return corev1.NodeCondition{}
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeMemoryPressure {
			return cond
		}
	}
	return corev1.NodeCondition{}
}

func runtimedLog(t *testing.T, s *server) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dataDir, "logs", "runtimed.log"))
	if err != nil {
		t.Fatalf("runtimed log: %v", err)
	}
	return string(b)
}

type eviction struct {
	pod string
	at  time.Time
}

// evictionTimes are the evictions runtimed logged ("evicting pod"), in
// order, with their times.
func evictionTimes(t *testing.T, s *server) []eviction {
	t.Helper()
	re := regexp.MustCompile(`time=(\S+) .*msg="evicting pod" pod=(\S+)`)
	var out []eviction
	for _, line := range strings.Split(runtimedLog(t, s), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatalf("log time %q: %v", m[1], err)
		}
		out = append(out, eviction{m[2], at})
	}
	return out
}
