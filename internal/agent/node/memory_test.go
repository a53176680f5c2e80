package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/runtime/pressure"
)

func memoryCondition(n *corev1.Node) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeMemoryPressure {
			return c
		}
	}
	return corev1.NodeCondition{}
}

// MemoryPressure follows memory.available<100Mi (the kubelet's default)
// and the transition period, with the kubelet's reasons, messages and
// events; DiskPressure is left alone.
func TestMemoryPressureCondition(t *testing.T) {
	fs := &fsStats{CapacityBytes: 1000, AvailableBytes: 500, Inodes: 1000, InodesFree: 500}
	d, rec, clock := testDisk(t, &fakeDiskRuntime{pods: &runtimev1.ListPodsResponse{}}, fs)
	avail := uint64(1 << 30)
	d.mem.read = func() (pressure.Memory, error) {
		return pressure.Memory{AvailableBytes: avail, TotalBytes: 4 << 30}, nil
	}
	var got []*corev1.Node
	d.setNode(nodeObject(Config{NodeConfig: roleconfig.NodeConfig{Name: "n1"}}, &runtimev1.GetRuntimeInfoResponse{}), func(n *corev1.Node) { got = append(got, n) })
	if c := memoryCondition(d.node); c.Status != corev1.ConditionFalse || c.Reason != "KubeletHasSufficientMemory" || c.Message != "kubelet has sufficient memory available" {
		t.Fatalf("initial condition %+v", c)
	}
	ctx := context.Background()
	d.housekeeping(ctx)
	if len(got) != 0 || len(events(rec)) != 0 {
		t.Fatalf("1Gi available: %d updates", len(got))
	}
	avail = 99 << 20
	d.housekeeping(ctx)
	if len(got) != 1 {
		t.Fatalf("99Mi available: %d updates", len(got))
	}
	c := memoryCondition(got[0])
	if c.Status != corev1.ConditionTrue || c.Reason != "KubeletHasInsufficientMemory" || c.Message != "kubelet has insufficient memory available" || !c.LastTransitionTime.Time.Equal(clock.t) {
		t.Fatalf("condition %+v", c)
	}
	if dc := diskCondition(got[0]); dc.Status != corev1.ConditionFalse {
		t.Errorf("DiskPressure changed: %+v", dc)
	}
	ev := strings.Join(events(rec), "\n")
	if !strings.Contains(ev, "Warning EvictionThresholdMet Attempting to reclaim memory") || !strings.Contains(ev, "Normal NodeHasInsufficientMemory Node n1 status is now: NodeHasInsufficientMemory") {
		t.Errorf("events %q", ev)
	}
	// Above the threshold again: True for the transition period, then False.
	avail = 200 << 20
	pressureEnds(t, d, clock, &got)
	if c := memoryCondition(got[1]); c.Status != corev1.ConditionFalse || c.Reason != "KubeletHasSufficientMemory" || !c.LastTransitionTime.Time.Equal(clock.t) {
		t.Errorf("cleared condition %+v", c)
	}
	if ev := strings.Join(events(rec), "\n"); !strings.Contains(ev, "Normal NodeHasSufficientMemory") {
		t.Errorf("events %q", ev)
	}
	if len(got[1].Status.Conditions) != 5 {
		t.Errorf("%d conditions", len(got[1].Status.Conditions))
	}
}

// Without memory.available in --eviction-hard memory is not watched; a bad
// threshold is an error naming the flag.
func TestMemoryPressureThresholdFromFlag(t *testing.T) {
	fs := &fsStats{CapacityBytes: 1000, AvailableBytes: 500, Inodes: 1000, InodesFree: 500}
	d, _, _ := testDisk(t, &fakeDiskRuntime{pods: &runtimev1.ListPodsResponse{}}, fs)
	if d.mem == nil || d.mem.threshold.Bytes != 100<<20 {
		t.Fatalf("default threshold: %+v", d.mem)
	}
	cfg := d.cfg
	cfg.EvictionHard = "nodefs.available<10%"
	d2, err := newDiskManager(cfg, "/data", "n1", nil, nil, d.log)
	if err != nil || d2.mem != nil {
		t.Fatalf("no memory signal: %+v %v", d2, err)
	}
	cfg.EvictionHard = "memory.available<lots"
	if _, err := newDiskManager(cfg, "/data", "n1", nil, nil, d.log); err == nil || !strings.Contains(err.Error(), "--eviction-hard") {
		t.Fatalf("bad threshold: %v", err)
	}
}

// An evicted pod carries the kubelet's DisruptionTarget condition beside
// phase Failed, reason Evicted and the message.
func TestEvictedPodStatus(t *testing.T) {
	msg := "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. "
	st := podStatus(&corev1.Pod{}, &runtimev1.PodStatus{Phase: runtimev1.PodPhase_POD_PHASE_FAILED, Reason: "Evicted", Message: msg}, "127.0.0.1", false)
	if st.Phase != corev1.PodFailed || st.Reason != "Evicted" || st.Message != msg {
		t.Fatalf("status %+v", st)
	}
	found := false
	for _, c := range st.Conditions {
		if c.Type == corev1.DisruptionTarget {
			found = c.Status == corev1.ConditionTrue && c.Reason == "TerminationByKubelet" && c.Message == msg
		}
	}
	if !found {
		t.Errorf("no DisruptionTarget condition: %+v", st.Conditions)
	}
	st = podStatus(&corev1.Pod{}, &runtimev1.PodStatus{Phase: runtimev1.PodPhase_POD_PHASE_FAILED, Reason: "Error"}, "127.0.0.1", false)
	for _, c := range st.Conditions {
		if c.Type == corev1.DisruptionTarget {
			t.Errorf("DisruptionTarget on a pod that was not evicted: %+v", c)
		}
	}
}

// The runtime daemon checks memory apart from the node and its eviction
// frees what it measured, so the node's own check may never see the
// threshold met (seen in the test VM): a pod the runtime evicted for
// memory makes MemoryPressure True for the transition period, as the
// kubelet's single eviction manager does; a pod already evicted when the
// node learns of it, or evicted for another reason, does not.
func TestMemoryEvictionSetsPressure(t *testing.T) {
	fs := &fsStats{CapacityBytes: 1000, AvailableBytes: 500, Inodes: 1000, InodesFree: 500}
	d, rec, clock := testDisk(t, &fakeDiskRuntime{pods: &runtimev1.ListPodsResponse{}}, fs)
	d.mem.read = func() (pressure.Memory, error) {
		return pressure.Memory{AvailableBytes: 1 << 30, TotalBytes: 4 << 30}, nil
	}
	var got []*corev1.Node
	d.setNode(nodeObject(Config{NodeConfig: roleconfig.NodeConfig{Name: "n1"}}, &runtimev1.GetRuntimeInfoResponse{}), func(n *corev1.Node) { got = append(got, n) })

	p := newProvider(nil, podspec.New(podspec.Config{}), "127.0.0.1", nil, nil, false)
	p.memoryEvicted = d.memoryEvicted
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.NotifyPods(ctx, func(*corev1.Pod) {})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	p.adopt(pod)
	// Already evicted when first heard of (a node restarted): no pressure.
	evicted := running("u1", 1)
	evicted.Phase, evicted.Reason = runtimev1.PodPhase_POD_PHASE_FAILED, "Evicted"
	evicted.Message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. "
	p.update(evicted)
	if len(got) != 0 {
		t.Fatalf("a pod evicted before the node knew it set MemoryPressure")
	}

	// A pod the runtime runs, known to the node.
	runningPod := func(uid, name string) {
		pod := pod.DeepCopy()
		pod.UID, pod.Name = types.UID(uid), name
		p.adopt(pod)
		r := running(uid, 1)
		r.Name = name
		p.update(r)
	}
	runningPod("u2", "q")
	// Evicted for disk: not memory pressure.
	disk := running("u2", 2)
	disk.Name, disk.Phase, disk.Reason, disk.Message = "q", runtimev1.PodPhase_POD_PHASE_FAILED, "Evicted", "Usage of EmptyDir volume \"v\" exceeds the limit \"1Mi\". "
	p.update(disk)
	if len(got) != 0 {
		t.Fatalf("an eviction for disk set MemoryPressure")
	}

	runningPod("u3", "r")
	d.housekeeping(ctx)
	if len(got) != 0 {
		t.Fatal("1Gi available: pressure")
	}
	ev := proto.Clone(evicted).(*runtimev1.PodStatus)
	ev.Uid, ev.Name, ev.Revision = "u3", "r", 2
	p.update(ev)
	if len(got) != 1 || memoryCondition(got[0]).Status != corev1.ConditionTrue {
		t.Fatalf("after the runtime's eviction for memory: %d updates", len(got))
	}
	if e := strings.Join(events(rec), "\n"); !strings.Contains(e, "Normal NodeHasInsufficientMemory") {
		t.Errorf("events %q", e)
	}
	// The node's checks find memory available: True for the transition
	// period, then False.
	pressureEnds(t, d, clock, &got)
}

// pressureEnds: with memory available again, MemoryPressure (reported
// once, in *got) stays True a minute later, within the 5m transition
// period, and is False after it.
func pressureEnds(t *testing.T, d *diskManager, clock *fakeClock, got *[]*corev1.Node) {
	t.Helper()
	clock.t = clock.t.Add(time.Minute)
	d.housekeeping(context.Background())
	if len(*got) != 1 {
		t.Fatal("condition changed within the transition period")
	}
	clock.t = clock.t.Add(5 * time.Minute)
	d.housekeeping(context.Background())
	if len(*got) != 2 || memoryCondition((*got)[1]).Status != corev1.ConditionFalse {
		t.Fatalf("after the transition period: %d updates", len(*got))
	}
}
