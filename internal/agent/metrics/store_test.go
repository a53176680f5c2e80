package metrics

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

func TestRateOf(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prev, last Usage
		want       uint64
		ok         bool
	}{
		{"half a core", Usage{Time: at(0), CPUNanos: 1e9}, Usage{Time: at(10), CPUNanos: 6e9, MemoryWorkingSet: 42}, 500_000_000, true},
		{"idle", Usage{Time: at(0), CPUNanos: 7}, Usage{Time: at(15), CPUNanos: 7}, 0, true},
		// 40 CPU-seconds in 10 s: Δcpu·1e9 would overflow uint64.
		{"four cores, no overflow", Usage{Time: at(0)}, Usage{Time: at(10), CPUNanos: 40e9}, 4_000_000_000, true},
		{"counter went back", Usage{Time: at(0), CPUNanos: 5e9}, Usage{Time: at(10), CPUNanos: 1e9}, 0, false},
		{"empty window", Usage{Time: at(3), CPUNanos: 1}, Usage{Time: at(3), CPUNanos: 2}, 0, false},
	} {
		r, ok := RateOf(tc.prev, tc.last)
		if ok != tc.ok || r.NanoCores != tc.want {
			t.Errorf("%s: got %d %v, want %d %v", tc.name, r.NanoCores, ok, tc.want, tc.ok)
		}
		if ok && (r.Window != tc.last.Time.Sub(tc.prev.Time) || !r.Timestamp.Equal(tc.last.Time) || r.Memory != tc.last.MemoryWorkingSet) {
			t.Errorf("%s: window/timestamp/memory: %+v", tc.name, r)
		}
	}
}

func TestRateResourceList(t *testing.T) {
	rl := Rate{NanoCores: 250_000_000, Memory: 64 << 20}.ResourceList()
	if cpu := rl[corev1.ResourceCPU]; cpu.MilliValue() != 250 || cpu.String() != "250m" {
		t.Errorf("cpu = %s", cpu.String())
	}
	if mem := rl[corev1.ResourceMemory]; mem.Value() != 64<<20 || mem.String() != "64Mi" {
		t.Errorf("memory = %s", mem.String())
	}
}

func pod(name string, cs ...ContainerSample) PodSample {
	return PodSample{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Containers: cs}
}

func ctr(name string, s int, cpu uint64) ContainerSample {
	return ContainerSample{Name: name, Usage: Usage{Time: at(s), CPUNanos: cpu, MemoryWorkingSet: cpu / 10}}
}

func TestStoreTwoSamples(t *testing.T) {
	s := NewStore()
	s.Add(&Sample{NodeOK: true, Node: Usage{Time: at(0), CPUNanos: 100e9, MemoryWorkingSet: 1 << 30}, Pods: []PodSample{pod("a", ctr("c", 0, 1e9))}})
	if _, ok := s.NodeRate(); ok {
		t.Fatal("node rate after one sample")
	}
	if got := s.PodRates(); len(got) != 0 {
		t.Fatalf("pod rates after one sample: %+v", got)
	}
	s.Add(&Sample{NodeOK: true, Node: Usage{Time: at(15), CPUNanos: 115e9, MemoryWorkingSet: 2 << 30},
		Pods: []PodSample{pod("a", ctr("c", 15, 4e9)), pod("b", ctr("c", 15, 1e9))}})
	nr, ok := s.NodeRate()
	if !ok || nr.NanoCores != 1e9 || nr.Memory != 2<<30 || nr.Window != 15*time.Second || !nr.Timestamp.Equal(at(15)) {
		t.Fatalf("node rate %+v %v", nr, ok)
	}
	got := s.PodRates()
	if len(got) != 1 || got[0].Name != "a" || got[0].UID != "uid-a" || len(got[0].Containers) != 1 {
		t.Fatalf("pod rates: %+v (b has one reading and must be left out)", got)
	}
	if c := got[0].Containers[0]; c.NanoCores != 200_000_000 || c.Memory != 4e8 || got[0].Window != 15*time.Second {
		t.Fatalf("container rate %+v", got[0])
	}
}

func TestStorePodNeedsEveryContainer(t *testing.T) {
	s := NewStore()
	s.Add(&Sample{Pods: []PodSample{pod("a", ctr("main", 0, 1e9))}})
	// A sidecar appears: the pod waits for its second reading too.
	s.Add(&Sample{Pods: []PodSample{pod("a", ctr("main", 10, 2e9), ctr("side", 10, 1e9))}})
	if got := s.PodRates(); len(got) != 0 {
		t.Fatalf("partial pod reported: %+v", got)
	}
	s.Add(&Sample{Pods: []PodSample{pod("a", ctr("main", 20, 3e9), ctr("side", 20, 3e9))}})
	got := s.PodRates()
	if len(got) != 1 || len(got[0].Containers) != 2 || got[0].Containers[0].Name != "main" || got[0].Containers[1].NanoCores != 200_000_000 {
		t.Fatalf("pod rates %+v", got)
	}
}

func TestStoreCounterResetAndForget(t *testing.T) {
	s := NewStore()
	s.Add(&Sample{Pods: []PodSample{pod("a", ctr("c", 0, 5e9))}})
	s.Add(&Sample{Pods: []PodSample{pod("a", ctr("c", 10, 6e9))}})
	if len(s.PodRates()) != 1 {
		t.Fatal("no rate")
	}
	// Restarted container: the counter drops; no rate until the next pair.
	s.Add(&Sample{Pods: []PodSample{pod("a", ctr("c", 20, 1e9))}})
	if got := s.PodRates(); len(got) != 0 {
		t.Fatalf("rate across a reset: %+v", got)
	}
	s.Add(&Sample{Pods: []PodSample{pod("a", ctr("c", 30, 2e9))}})
	if got := s.PodRates(); len(got) != 1 || got[0].Containers[0].NanoCores != 100_000_000 {
		t.Fatalf("after reset: %+v", got)
	}
	// A pod missing from a scrape is gone; coming back it starts over.
	s.Add(&Sample{})
	s.Add(&Sample{Pods: []PodSample{pod("a", ctr("c", 50, 9e9))}})
	if got := s.PodRates(); len(got) != 0 {
		t.Fatalf("forgotten pod kept its readings: %+v", got)
	}
	// A pod recreated under the same name is a new series (new UID).
	s.Add(&Sample{Pods: []PodSample{{Namespace: "ns", Name: "a", UID: "other", Containers: []ContainerSample{ctr("c", 60, 10e9)}}}})
	if got := s.PodRates(); len(got) != 0 {
		t.Fatalf("rate across pod identities: %+v", got)
	}
}

func TestStoreNodeFallsBackToContainers(t *testing.T) {
	s := NewStore()
	s.Add(&Sample{Node: Usage{Time: at(0)}, Pods: []PodSample{pod("a", ctr("c", 0, 1e9)), pod("b", ctr("c", 0, 1e9))}})
	s.Add(&Sample{Node: Usage{Time: at(10)}, Pods: []PodSample{pod("a", ctr("c", 10, 6e9)), pod("b", ctr("c", 10, 6e9))}})
	r, ok := s.NodeRate()
	if !ok || r.NanoCores != 1e9 || r.Memory != 12e8 {
		t.Fatalf("node from containers: %+v %v", r, ok)
	}
}
