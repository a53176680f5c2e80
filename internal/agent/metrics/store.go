// Package metrics owns k3sm's built-in metrics.k8s.io API: it samples the
// node's and its containers' cumulative CPU time and memory working set,
// turns two samples into CPU rates the way metrics-server does, and serves
// NodeMetrics and PodMetrics (v1beta1) over HTTPS to the apiserver's
// aggregation layer, authenticating the front-proxy client certificate and
// delegating authorization. Given a scraper's credential (the server's
// node), it serves the other nodes' too, scraped from their kubelets
// (remote.go). It also renders the kubelet's /metrics/resource families.
package metrics

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// Usage is one cumulative reading.
type Usage struct {
	Time             time.Time
	CPUNanos         uint64 // cumulative CPU time (user+system), ns
	MemoryWorkingSet uint64 // bytes
}

// ContainerSample is one container's reading.
type ContainerSample struct {
	Name string
	Usage
}

// PodSample is one pod's containers' readings.
type PodSample struct {
	Namespace, Name string
	UID             types.UID
	Containers      []ContainerSample
}

// Sample is one scrape of the node: the whole machine and every container.
type Sample struct {
	Node Usage
	// NodeOK is false where the machine-wide reading is not available; the
	// node's usage is then the sum of its containers.
	NodeOK bool
	Pods   []PodSample
}

// point pairs: metrics-server keeps the last two readings of each series.
type series struct {
	prev, last Usage
	hasPrev    bool
}

// add records u; a counter that went backwards (a process of the container
// exited, or the container restarted) starts the series over, as
// metrics-server drops such pairs.
func (s *series) add(u Usage) {
	if !u.Time.After(s.last.Time) {
		return
	}
	if s.last.Time.IsZero() || u.CPUNanos < s.last.CPUNanos {
		*s = series{last: u}
		return
	}
	s.prev, s.last, s.hasPrev = s.last, u, true
}

// Rate is the usage over the window between the two last readings.
type Rate struct {
	Timestamp time.Time
	Window    time.Duration
	NanoCores uint64
	Memory    uint64
}

// rate turns the pair into a CPU rate; false when there is no pair yet.
func (s *series) rate() (Rate, bool) {
	if !s.hasPrev {
		return Rate{}, false
	}
	return RateOf(s.prev, s.last)
}

// RateOf computes the CPU rate in nanocores between two cumulative
// readings; the memory is the later reading's. It is false when the window
// is empty or the counter went backwards.
func RateOf(prev, last Usage) (Rate, bool) {
	dt := last.Time.Sub(prev.Time)
	if dt <= 0 || last.CPUNanos < prev.CPUNanos {
		return Rate{}, false
	}
	// float: Δcpu·1e9 overflows uint64 beyond 18 CPU-seconds per window.
	nc := float64(last.CPUNanos-prev.CPUNanos) / float64(dt.Nanoseconds()) * 1e9
	return Rate{Timestamp: last.Time, Window: dt, NanoCores: uint64(nc + 0.5), Memory: last.MemoryWorkingSet}, true
}

// ResourceList renders a rate as the metrics API's usage.
func (r Rate) ResourceList() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewScaledQuantity(int64(r.NanoCores), resource.Nano),
		corev1.ResourceMemory: *resource.NewQuantity(int64(r.Memory), resource.BinarySI),
	}
}

type podKey struct {
	ns, name string
	uid      types.UID
}

type podSeries struct {
	containers map[string]*series
	order      []string // container names in the order of the last sample
}

// Store keeps the last two readings of the node and of every container.
type Store struct {
	mu   sync.Mutex
	node series
	pods map[podKey]*podSeries
}

// NewStore returns an empty store.
func NewStore() *Store { return &Store{pods: map[podKey]*podSeries{}} }

// Add records a scrape. Pods and containers missing from it are forgotten.
func (s *Store) Add(sm *Sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	node := sm.Node
	if !sm.NodeOK {
		node = Usage{Time: sm.Node.Time}
		for _, p := range sm.Pods {
			for _, c := range p.Containers {
				node.CPUNanos += c.CPUNanos
				node.MemoryWorkingSet += c.MemoryWorkingSet
			}
		}
	}
	s.node.add(node)
	seen := map[podKey]bool{}
	for _, p := range sm.Pods {
		k := podKey{p.Namespace, p.Name, p.UID}
		seen[k] = true
		ps := s.pods[k]
		if ps == nil {
			ps = &podSeries{containers: map[string]*series{}}
			s.pods[k] = ps
		}
		names := map[string]bool{}
		ps.order = ps.order[:0]
		for _, c := range p.Containers {
			names[c.Name] = true
			ps.order = append(ps.order, c.Name)
			cs := ps.containers[c.Name]
			if cs == nil {
				cs = &series{}
				ps.containers[c.Name] = cs
			}
			cs.add(c.Usage)
		}
		for n := range ps.containers {
			if !names[n] {
				delete(ps.containers, n)
			}
		}
	}
	for k := range s.pods {
		if !seen[k] {
			delete(s.pods, k)
		}
	}
}

// NodeRate is the machine's usage over the last window.
func (s *Store) NodeRate() (Rate, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.node.rate()
}

// PodRate is one pod's usage: a rate per container, the pod's timestamp
// (the latest container reading) and window (the longest).
type PodRate struct {
	Namespace, Name string
	UID             types.UID
	Timestamp       time.Time
	Window          time.Duration
	Containers      []ContainerRate
}

// ContainerRate is one container's usage.
type ContainerRate struct {
	Name string
	Rate
}

// PodRates returns the pods whose every container has a rate; like
// metrics-server, a pod with a container still waiting for its second
// reading is left out rather than reported with part of its usage.
func (s *Store) PodRates() []PodRate {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []PodRate
next:
	for k, ps := range s.pods {
		if len(ps.order) == 0 {
			continue
		}
		pr := PodRate{Namespace: k.ns, Name: k.name, UID: k.uid}
		for _, n := range ps.order {
			r, ok := ps.containers[n].rate()
			if !ok {
				continue next
			}
			if r.Timestamp.After(pr.Timestamp) {
				pr.Timestamp = r.Timestamp
			}
			if r.Window > pr.Window {
				pr.Window = r.Window
			}
			pr.Containers = append(pr.Containers, ContainerRate{Name: n, Rate: r})
		}
		out = append(out, pr)
	}
	return out
}
