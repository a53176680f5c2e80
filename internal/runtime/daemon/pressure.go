package daemon

import (
	"context"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/pod"
	"github.com/k3sm-dev/k3sm/internal/runtime/pressure"
)

// runMemoryEviction is the kubelet's eviction manager for memory.available:
// every interval, under the threshold, one pod is evicted. Usage comes from
// ListPodStats, the figures /stats/summary and kubectl top show.
func (s *server) runMemoryEviction(ctx context.Context) {
	if s.cfg.MemoryThreshold == nil {
		s.log.Info("memory eviction off: --eviction-hard has no memory.available threshold")
		return
	}
	m, err := pressure.ReadMemory()
	if err != nil {
		s.log.Warn("memory eviction off", "err", err)
		return
	}
	s.log.Info("memory eviction on", "available", m.AvailableBytes, "signal", m.Source)
	pressure.Run(ctx, pressure.Config{Threshold: *s.cfg.MemoryThreshold, Interval: s.cfg.HousekeepingInterval,
		Pods: s.evictionCandidates, Log: s.log.With("component", "eviction"),
		Evict: func(p pressure.Pod, msg string) error { return s.mgr.Evict(p.UID, msg) }})
}

// evictionCandidates are the node's active pods (not terminal, not being
// deleted, not evicted yet) with their memory request and usage.
func (s *server) evictionCandidates(ctx context.Context) ([]pressure.Pod, error) {
	sts, specs := s.mgr.List()
	st, err := s.ListPodStats(ctx, &runtimev1.ListPodStatsRequest{})
	if err != nil {
		return nil, err
	}
	usage := map[string]map[string]uint64{}
	for _, ps := range st.GetPods() {
		u := map[string]uint64{}
		for _, c := range ps.GetContainers() {
			u[c.GetName()] = c.GetMemoryWorkingSetBytes()
		}
		usage[ps.GetUid()] = u
	}
	var out []pressure.Pod
	for i, spec := range specs {
		ps := sts[i]
		switch {
		case ps.GetTerminating(), ps.GetReason() == "Evicted",
			ps.GetPhase() == runtimev1.PodPhase_POD_PHASE_SUCCEEDED, ps.GetPhase() == runtimev1.PodPhase_POD_PHASE_FAILED:
			continue
		}
		p := pressure.Pod{UID: spec.GetUid(), Namespace: spec.GetNamespace(), Name: spec.GetName(), Priority: spec.GetPriority(),
			Critical: pressure.IsCritical(spec.GetAnnotations(), spec.GetPriority())}
		u, found := usage[spec.GetUid()]
		p.HasStats = found
		for _, v := range u {
			p.UsageBytes += int64(v)
		}
		for _, c := range spec.GetContainers() {
			v, ok := u[c.GetName()]
			p.Containers = append(p.Containers, pressure.Container{Name: c.GetName(), RequestBytes: c.GetResources().GetMemoryRequestBytes(),
				UsageBytes: int64(v), HasUsage: ok})
		}
		p.RequestBytes = pod.PodTotal(spec, (*runtimev1.Resources).GetMemoryRequestBytes)
		out = append(out, p)
	}
	return out, nil
}
