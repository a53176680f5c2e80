package metrics

import (
	"context"
	"errors"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Source takes one scrape.
type Source interface {
	Scrape(ctx context.Context) (*Sample, error)
}

// RuntimeSource scrapes the runtime daemon's per-container readings
// (ListPodStats) and the machine's own CPU and memory.
type RuntimeSource struct {
	Runtime runtimev1.RuntimeClient
	// Host reads the machine-wide usage; nil means the platform default.
	Host func() (Usage, error)
}

// Scrape implements Source.
func (r RuntimeSource) Scrape(ctx context.Context) (*Sample, error) {
	resp, err := r.Runtime.ListPodStats(ctx, &runtimev1.ListPodStatsRequest{})
	if err != nil {
		return nil, err
	}
	now := time.Now()
	sm := &Sample{}
	host := r.Host
	if host == nil {
		host = HostUsage
	}
	if u, err := host(); err == nil {
		sm.Node, sm.NodeOK = u, true
	} else if !errors.Is(err, ErrUnsupported) {
		return nil, err
	}
	sm.Node.Time = now
	for _, p := range resp.GetPods() {
		ps := PodSample{Namespace: p.GetNamespace(), Name: p.GetName(), UID: types.UID(p.GetUid())}
		for _, c := range p.GetContainers() {
			t := now
			if c.GetTimestamp() != nil {
				t = c.GetTimestamp().AsTime()
			}
			ps.Containers = append(ps.Containers, ContainerSample{Name: c.GetName(), Usage: Usage{
				Time: t, CPUNanos: c.GetCpuUsageCoreNanoseconds(), MemoryWorkingSet: c.GetMemoryWorkingSetBytes()}})
		}
		sm.Pods = append(sm.Pods, ps)
	}
	return sm, nil
}

// ErrUnsupported: no machine-wide reading on this platform.
var ErrUnsupported = errors.New("metrics: machine-wide usage not supported on this platform")
