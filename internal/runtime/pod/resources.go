package pod

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/runtime/stats"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Resource limits. With cgroups (Config.Cgroups) every container attempt
// gets a fresh cgroup below its pod's, limited from its ContainerSpec
// resources, and the kernel enforces them; an attempt whose cgroup saw an
// OOM kill ends OOMKilled. Where a controller is missing, the sampler
// below stands in: memory limits checked about once a second against the
// process group's resident memory (SIGKILL, OOMKilled), CPU as a nice
// priority by QoS class.

// SampleInterval is how often the fallback sampler runs.
const SampleInterval = time.Second

// oomKilledReason is the kubelet's terminated reason for an OOM kill.
const oomKilledReason = "OOMKilled"

// resourceState is the sampler's memory, keyed by container id (one per
// attempt).
type resourceState struct {
	mu    sync.Mutex
	oom   map[string]bool // killed by the sampler for a memory breach
	niced map[string]bool // priority set
}

func (s *resourceState) markOOM(id string) {
	s.mu.Lock()
	if s.oom == nil {
		s.oom = map[string]bool{}
	}
	s.oom[id] = true
	s.mu.Unlock()
}

// takeOOM reports (and forgets) a sampler kill of attempt id.
func (s *resourceState) takeOOM(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := s.oom[id]
	delete(s.oom, id)
	return ok
}

// containerResources are a container's own cgroup limits.
func containerResources(c *runtimev1.ContainerSpec) cgroups.Resources {
	r := c.GetResources()
	return cgroups.Resources{MemoryLimitBytes: r.GetMemoryLimitBytes(), CPULimitMillis: r.GetCpuLimitMillis(),
		CPURequestMillis: r.GetCpuRequestMillis()}
}

// podResources are the pod cgroup's limits as the kubelet sets them
// (ResourceConfigForPod): CPU weight from the pod's effective request; CPU
// and memory limits only when every container (init ones included)
// declares one, then the effective limit. Ephemeral containers declare
// none and are left out, as the kubelet does.
func podResources(spec *runtimev1.PodSpec) cgroups.Resources {
	all := append(append([]*runtimev1.ContainerSpec{}, spec.GetInitContainers()...), spec.GetContainers()...)
	allHave := func(get func(*runtimev1.Resources) int64) bool {
		for _, c := range all {
			if get(c.GetResources()) <= 0 {
				return false
			}
		}
		return len(all) > 0
	}
	cpuReq := func(r *runtimev1.Resources) int64 { return r.GetCpuRequestMillis() }
	cpuLim := func(r *runtimev1.Resources) int64 { return r.GetCpuLimitMillis() }
	memLim := func(r *runtimev1.Resources) int64 { return r.GetMemoryLimitBytes() }
	out := cgroups.Resources{CPURequestMillis: PodTotal(spec, cpuReq)}
	if allHave(cpuLim) {
		out.CPULimitMillis = PodTotal(spec, cpuLim)
	}
	if allHave(memLim) {
		out.MemoryLimitBytes = PodTotal(spec, memLim)
	}
	return out
}

// PodTotal is the kubelet's pod total of one resource (PodRequests /
// PodLimits), for the pod's cgroup and for eviction's ranking: the regular containers and native sidecars together, or
// more if an init container (with the sidecars started before it) needs
// more.
func PodTotal(spec *runtimev1.PodSpec, get func(*runtimev1.Resources) int64) int64 {
	var sum, sidecars, initMax int64
	for _, c := range spec.GetContainers() {
		sum += get(c.GetResources())
	}
	for _, c := range spec.GetInitContainers() {
		v := get(c.GetResources())
		if c.GetRestartPolicy() == runtimev1.ContainerRestartPolicy_CONTAINER_RESTART_POLICY_ALWAYS {
			sum += v
			sidecars += v
			initMax = max(initMax, sidecars)
			continue
		}
		initMax = max(initMax, v+sidecars)
	}
	return max(sum, initMax)
}

// QoS classes, as the kubelet computes them.
const (
	qosGuaranteed = "Guaranteed"
	qosBurstable  = "Burstable"
	qosBestEffort = "BestEffort"
)

// qosClass: BestEffort when no container asks for CPU or memory;
// Guaranteed when every container has CPU and memory limits equal to its
// requests (an unset request defaults to the limit, as the API does);
// Burstable otherwise.
func qosClass(spec *runtimev1.PodSpec) string {
	all := append(append([]*runtimev1.ContainerSpec{}, spec.GetInitContainers()...), spec.GetContainers()...)
	any, guaranteed := false, len(all) > 0
	for _, c := range all {
		r := c.GetResources()
		if r.GetCpuRequestMillis() > 0 || r.GetCpuLimitMillis() > 0 || r.GetMemoryRequestBytes() > 0 || r.GetMemoryLimitBytes() > 0 {
			any = true
		}
		eq := func(req, lim int64) bool { return lim > 0 && (req == 0 || req == lim) }
		if !eq(r.GetCpuRequestMillis(), r.GetCpuLimitMillis()) || !eq(r.GetMemoryRequestBytes(), r.GetMemoryLimitBytes()) {
			guaranteed = false
		}
	}
	switch {
	case !any:
		return qosBestEffort
	case guaranteed:
		return qosGuaranteed
	}
	return qosBurstable
}

// niceFor is the fallback's CPU priority by QoS class: Guaranteed keeps
// the daemon's, Burstable yields, BestEffort runs only on otherwise idle
// CPU time (nice 19, the lowest).
func niceFor(qos string) int {
	switch qos {
	case qosGuaranteed:
		return 0
	case qosBurstable:
		return 5
	}
	return 19
}

// containerCgroups prepares the cgroups of attempt c (pod first, then a
// fresh container cgroup) and returns the directories for ProcessSpec.
// Without cgroups it returns none.
func (p *managedPod) containerCgroups(spec *runtimev1.PodSpec, c *container, cspec *runtimev1.ContainerSpec) ([]string, error) {
	cg := p.m.cfg.Cgroups
	p.noteUnenforced(c, cspec)
	if cg.Version() == cgroups.None {
		return nil, nil
	}
	if err := cg.SetPod(p.uid, podResources(spec)); err != nil {
		return nil, err
	}
	return cg.NewContainer(p.uid, c.name, containerResources(cspec))
}

// limitNotEnforcedReason is the Warning event of a container whose CPU or
// memory limit the kernel does not hold it to: without it the fallback
// is silent (a 100m pod was seen using 391m).
const limitNotEnforcedReason = "LimitNotEnforced"

// noteUnenforced emits limitNotEnforcedReason once per container and
// daemon (not per restart: the cause is the node's, and lasts).
func (p *managedPod) noteUnenforced(c *container, cspec *runtimev1.ContainerSpec) {
	p.mu.Lock()
	noted := c.limitsNoted
	c.limitsNoted = true
	p.mu.Unlock()
	if noted {
		return
	}
	if msg := unenforcedLimits(cspec.GetResources(), p.m.cfg.Cgroups.Support()); msg != "" {
		p.event(warning, limitNotEnforcedReason, c.name, msg)
	}
}

// unenforcedLimits says which of r's limits the kernel does not enforce
// under s, and why; "" when it enforces them all.
func unenforcedLimits(r *runtimev1.Resources, s cgroups.Support) string {
	var what []string
	if l := r.GetCpuLimitMillis(); l > 0 && !s.Enforces(cgroups.CPU) {
		what = append(what, fmt.Sprintf("CPU limit %dm is not enforced (CPU time is only weighted by a nice priority)", l))
	}
	if l := r.GetMemoryLimitBytes(); l > 0 && !s.Enforces(cgroups.Memory) {
		what = append(what, fmt.Sprintf("memory limit %s is not held by the kernel (the runtime checks it about once a second)", binaryQuantity(l)))
	}
	if len(what) == 0 {
		return ""
	}
	msg := strings.Join(what, "; ") + ": " + s.Reason
	if s.Fix != "" {
		msg += " (`k3sm doctor` on the node says how to fix it)"
	}
	return msg
}

// binaryQuantity writes bytes as Kubernetes writes a binary quantity (a
// memory limit, an emptyDir sizeLimit): 64Mi, 1Gi, or a plain number when
// no binary suffix is exact (1k below 1Ki, as the API shows 1000).
func binaryQuantity(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }

// noteOOM turns the termination of an attempt the kernel (its cgroup's
// oom_kill counter) or the sampler killed for memory into OOMKilled. An
// attempt that still exited 0 stays Completed: the kill did not end it.
// Caller holds p.mu.
func (p *managedPod) noteOOM(c *container, t *terminated) {
	sampled := p.m.res.takeOOM(c.containerID)
	if t.Reason != "Error" {
		return
	}
	if !sampled {
		cg := p.m.cfg.Cgroups
		if !cg.Has(cgroups.Memory) {
			return
		}
		if n, err := cg.OOMKills(p.uid, c.name); err != nil || n == 0 {
			return
		}
	}
	t.Reason = oomKilledReason
	if t.Message == "" {
		t.Message = fmt.Sprintf("the container used more than its memory limit of %d bytes", c.spec.GetResources().GetMemoryLimitBytes())
	}
}

// removeCgroupsOf removes pod uid's cgroups once its containers stopped,
// killing whatever is left in them (also of a pod whose state could not be
// loaded: nothing of it may run on).
func (m *Manager) removeCgroupsOf(uid string) {
	if cg := m.cfg.Cgroups; cg != nil {
		if err := cg.RemovePod(uid); err != nil {
			m.log.Error("remove pod cgroups", "pod", uid, "err", err)
		}
	}
}

// sampleTarget is one running attempt the sampler looks at.
type sampleTarget struct {
	p     *managedPod
	name  string
	id    string // container id: one per attempt
	proc  Process
	limit int64 // memory limit, bytes (0: none)
	nice  int
}

// enforceResources is the fallback for what cgroups do not cover here:
// every SampleInterval, memory limits (without a memory controller) and
// CPU priorities (without a cpu controller).
func (m *Manager) enforceResources(ctx context.Context) {
	cg := m.cfg.Cgroups
	memory, cpu := !cg.Has(cgroups.Memory), !cg.Has(cgroups.CPU)
	if !memory && !cpu {
		return
	}
	t := time.NewTicker(SampleInterval)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		targets := m.sampleTargets()
		if cpu {
			m.res.renice(targets, m.log)
		}
		if memory {
			if err := m.killOverMemory(targets); err != nil && !warned {
				warned = true
				m.log.Warn("memory limits are not enforced: the sampler cannot read processes' memory", "err", err)
			}
		}
	}
}

func (m *Manager) sampleTargets() []sampleTarget {
	m.mu.Lock()
	pods := make([]*managedPod, 0, len(m.pods))
	for _, p := range m.pods {
		pods = append(pods, p)
	}
	m.mu.Unlock()
	var out []sampleTarget
	for _, p := range pods {
		p.mu.Lock()
		nice := niceFor(qosClass(p.spec))
		for _, c := range p.all() {
			if c.proc == nil {
				continue
			}
			out = append(out, sampleTarget{p: p, name: c.name, id: c.containerID, proc: c.proc,
				limit: c.spec.GetResources().GetMemoryLimitBytes(), nice: nice})
		}
		p.mu.Unlock()
	}
	return out
}

// renice gives each new attempt's process group its class's priority
// (its children inherit it).
func (s *resourceState) renice(targets []sampleTarget, log interface{ Warn(string, ...any) }) {
	seen := map[string]bool{}
	for _, t := range targets {
		seen[t.id] = true
		s.mu.Lock()
		done := s.niced[t.id]
		s.mu.Unlock()
		if done || t.nice == 0 {
			continue
		}
		if err := syscall.Setpriority(syscall.PRIO_PGRP, t.proc.Pid(), t.nice); err != nil {
			log.Warn("set the CPU priority of a container", "container", t.name, "nice", t.nice, "err", err)
		}
		s.mu.Lock()
		if s.niced == nil {
			s.niced = map[string]bool{}
		}
		s.niced[t.id] = true
		s.mu.Unlock()
	}
	s.mu.Lock()
	for id := range s.niced {
		if !seen[id] {
			delete(s.niced, id)
		}
	}
	s.mu.Unlock()
}

// killOverMemory SIGKILLs the process group of every attempt whose
// resident memory (summed over the group) is above its limit, and marks it
// for OOMKilled.
func (m *Manager) killOverMemory(targets []sampleTarget) error {
	var pgids []int
	for _, t := range targets {
		if t.limit > 0 {
			pgids = append(pgids, t.proc.Pid())
		}
	}
	if len(pgids) == 0 {
		return nil
	}
	samples, err := stats.ProcessGroups(pgids)
	if err != nil {
		return err
	}
	for _, t := range targets {
		s, ok := samples[t.proc.Pid()]
		if t.limit <= 0 || !ok || s.RSSBytes <= uint64(t.limit) {
			continue
		}
		m.res.markOOM(t.id)
		m.log.Warn("container over its memory limit: killed", "pod", t.p.key(), "container", t.name,
			"rss", s.RSSBytes, "limit", t.limit)
		if err := t.proc.Signal(syscall.SIGKILL); err != nil {
			m.log.Warn("kill a container over its memory limit", "pod", t.p.key(), "container", t.name, "err", err)
		}
	}
	return nil
}
