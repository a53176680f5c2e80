package proxy

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/backoff"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
	corev1 "k8s.io/api/core/v1"
)

// Kernel translates ClusterIP Services in the kernel (k3sm-netd's nftables
// table on Linux): a connection to a ClusterIP is sent to an endpoint by
// DNAT, with no relay copying its bytes and with the client's own address
// kept, so the backend's NetworkPolicy sees who is calling. SetServices
// replaces the whole set at once.
type Kernel interface {
	SetServices(ctx context.Context, svcs []KernelService) error
}

// KernelService is one Service port on a ClusterIP, (External) an
// address of spec.externalIPs, (NodePort) a nodePort on a node address or
// (LoadBalancer) the load-balancer ingress, a node address; and its
// endpoints (none: refused). Local keeps the client's address
// (externalTrafficPolicy: Local; the endpoints are this node's pods).
type KernelService struct {
	Protocol     corev1.Protocol
	IP           netip.Addr
	Port         uint16
	External     bool
	NodePort     bool
	LoadBalancer bool
	Local        bool
	Endpoints    []netip.AddrPort
}

func kernelService(s frontendSpec) KernelService {
	return KernelService{Protocol: s.key.proto, IP: s.key.addr.Addr(), Port: s.key.addr.Port(),
		External: s.kind == kindExternalIP, NodePort: s.kind == kindNodePort, LoadBalancer: s.kind == kindLoadBalancer,
		Local: s.local, Endpoints: s.endpoints}
}

// Defaults of the kernel path.
const (
	// DefaultKernelDebounce gathers a burst of endpoint changes (a
	// rollout) into one transaction.
	DefaultKernelDebounce = 100 * time.Millisecond
	// DefaultKernelResync sends the full set again although nothing
	// changed: netd keeps no copy, and a flushed ruleset or a reboot of the
	// helper's state is repaired within this.
	DefaultKernelResync = time.Minute
)

// Mode names which path serves ClusterIPs, for logs and status.
func (p *Proxy) Mode() string {
	if p.cfg.Kernel != nil {
		return "nftables"
	}
	return "userspace"
}

// inKernel reports whether a frontend goes to the kernel: ClusterIPs,
// externalIPs, and NodePort and LoadBalancer frontends on a node address
// that is not loopback (kube-proxy's nftables mode does not serve
// localhost node ports either; the relay does) and with endpoints (without,
// the relay's closed socket refuses, and no reject rule can shadow a host
// process that took the port); without session affinity (kube-proxy keeps
// it in a dynamic set; the relay does it here) or loadBalancerSourceRanges
// (the relay checks them); with endpoints the kernel can translate to (a
// loopback address, the apiserver fallback of the kubernetes Service, it
// cannot: pods have no route to the node's lo). A NodePort or
// LoadBalancer frontend goes there only once the relay holds its port
// (see sync).
func (p *Proxy) inKernel(s frontendSpec) bool {
	if p.cfg.Kernel == nil || s.kind == kindHostPort || s.affinity != 0 || s.allow != nil || !s.key.addr.Addr().Is4() {
		return false
	}
	onNode := s.kind == kindNodePort || s.kind == kindLoadBalancer
	// What netd refuses as a Service address (wire.ParseServiceAddr and,
	// for external ones, link-local and class E): the apiserver refuses
	// such externalIPs too, but one would fail the whole set.
	if a := s.key.addr.Addr(); s.kind != kindClusterIP && (!a.IsGlobalUnicast() || a.As4()[0] == 0 || a.As4()[0] >= 240) {
		return false
	}
	if onNode && (len(s.endpoints) == 0 || s.kind == kindNodePort && (s.key.addr.Port() < wire.NodePortMin || s.key.addr.Port() > wire.NodePortMax)) {
		return false
	}
	// netd keeps the client's address only towards this node's pods; a
	// Local endpoint outside them (a hostNetwork pod's node address)
	// would fail the whole set.
	if s.local && slices.ContainsFunc(s.endpoints, func(e netip.AddrPort) bool {
		return !slices.ContainsFunc(p.cfg.PodRanges, func(r netip.Prefix) bool { return r.Contains(e.Addr()) })
	}) {
		return false
	}
	// The ranges netd refuses (wire.ParseServiceAddr): one such endpoint
	// would fail the whole set.
	return !slices.ContainsFunc(s.endpoints, func(e netip.AddrPort) bool {
		a := e.Addr()
		return !a.Is4() || a.IsLoopback() || a.As4()[0] == 0 || a.IsMulticast() || e.Port() == 0
	})
}

// kernelState is the desired kernel set by Service, written by the worker
// and sent by the flusher.
type kernelState struct {
	mu    sync.Mutex
	bySvc map[string][]KernelService // ns/name → its ports
	kick  chan struct{}              // a change to send (buffered 1)
}

func newKernelState() *kernelState {
	return &kernelState{bySvc: map[string][]KernelService{}, kick: make(chan struct{}, 1)}
}

// set records svc's kernel ports (none: it has none there) and kicks the
// flusher when they changed.
func (k *kernelState) set(svc string, ports []KernelService) {
	k.mu.Lock()
	old, had := k.bySvc[svc]
	if len(ports) == 0 {
		delete(k.bySvc, svc)
	} else {
		k.bySvc[svc] = ports
	}
	changed := had != (len(ports) > 0) || !slices.EqualFunc(old, ports, sameKernelService)
	k.mu.Unlock()
	if changed {
		select {
		case k.kick <- struct{}{}:
		default:
		}
	}
}

func sameKernelService(a, b KernelService) bool {
	return a.Protocol == b.Protocol && a.IP == b.IP && a.Port == b.Port && a.External == b.External &&
		a.NodePort == b.NodePort && a.LoadBalancer == b.LoadBalancer && a.Local == b.Local && slices.Equal(a.Endpoints, b.Endpoints)
}

// kernelRank orders Service ports of one address and port: a ClusterIP
// first, then an externalIP, a load-balancer ingress, a nodePort.
func kernelRank(s KernelService) int {
	switch {
	case s.External:
		return 1
	case s.LoadBalancer:
		return 2
	case s.NodePort:
		return 3
	}
	return 0
}

// snapshot is the full set, sorted so that equal sets compare equal.
func (k *kernelState) snapshot() []KernelService {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []KernelService
	names := slices.Sorted(maps.Keys(k.bySvc))
	for _, name := range names {
		out = append(out, k.bySvc[name]...)
	}
	slices.SortStableFunc(out, func(a, b KernelService) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return int(a.Port) - int(b.Port)
		}
		if c := strings.Compare(string(a.Protocol), string(b.Protocol)); c != 0 {
			return c
		}
		return kernelRank(a) - kernelRank(b)
	})
	// Two Services cannot share a ClusterIP, but a stale cache may hold
	// both for a moment, and nothing stops two Services from naming one
	// externalIP and port (or a ClusterIP of another, or the node's address
	// and a port a LoadBalancer has): the first wins (by kernelRank, else
	// the first Service by namespace/name), as netd refuses duplicates.
	return slices.CompactFunc(out, func(a, b KernelService) bool {
		return a.IP == b.IP && a.Port == b.Port && a.Protocol == b.Protocol
	})
}

// runKernel sends the set after each burst of changes, again every
// resync, and retries a failed send with a backoff, until ctx ends. It
// starts by sending the set the informers' first sync built (an empty one
// clears what a previous node left).
func (p *Proxy) runKernel(ctx context.Context, synced <-chan struct{}) {
	debounce, resync := p.cfg.KernelDebounce, p.cfg.KernelResync
	select {
	case <-synced:
	case <-ctx.Done():
		return
	}
	// The wait before sending again after a failed send: 500 ms doubling
	// to 10 s; Delay 0 while sends succeed.
	retry := backoff.Backoff{Initial: 500 * time.Millisecond, Max: 10 * time.Second}
	var sent []KernelService
	first := true
	tick := time.NewTicker(resync)
	defer tick.Stop()
	for {
		// Gather the burst: changes keep arriving within debounce.
		wait := time.NewTimer(debounce)
		if retry.Delay() > 0 {
			wait.Reset(retry.Delay())
		}
		began := time.Now()
	gather:
		for {
			select {
			case <-ctx.Done():
				wait.Stop()
				return
			case <-p.kernel.kick:
				// A steady stream of changes still goes out every 10 debounces.
				if retry.Delay() == 0 && time.Since(began) < 10*debounce {
					wait.Reset(debounce)
				}
			case <-wait.C:
				break gather
			}
		}
		set := p.kernel.snapshot()
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := p.cfg.Kernel.SetServices(sctx, set)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d := retry.Next()
			p.log.Warn("service proxy: cannot program the kernel's Service rules (k3sm-netd); retrying", "servicePorts", len(set), "retryIn", d, "err", err)
			continue
		}
		retry.Reset()
		endpoints := 0
		for _, s := range set {
			endpoints += len(s.Endpoints)
		}
		if first || !slices.EqualFunc(sent, set, sameKernelService) {
			p.log.Info("service proxy: kernel Service rules set", "mode", "nftables", "servicePorts", len(set), "endpoints", endpoints, "took", time.Since(start).Round(time.Millisecond))
		}
		first, sent = false, set
		if p.kernelSent != nil {
			p.kernelSent(set)
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kernel.kick:
		case <-tick.C:
		}
	}
}
