// Package proxy owns the node's Service proxy. It watches Services and
// EndpointSlices and serves every ClusterIP, NodePort, LoadBalancer and
// external address of a Service by one of two paths:
//
//   - the kernel (Config.Kernel: k3sm-netd's nftables on Linux), for
//     ClusterIPs, externalIPs, and NodePorts and LoadBalancers on a node
//     address that is not loopback, of TCP and UDP without session
//     affinity or loadBalancerSourceRanges: DNAT to an endpoint, no byte
//     copied, the client's address kept for pods and, with
//     externalTrafficPolicy: Local, for clients beyond the node (see
//     kernel.go);
//   - a userspace relay, for the rest and where there is no kernel path
//     (darwin, no netd, --service-proxy=userspace): a listening socket per
//     Service address in the node process that accepts connections (or
//     datagrams) and relays them to an endpoint. An externalIP gets one
//     only where it is an address of the node.
//
// A TCP port without endpoints has its socket closed (or, in the kernel,
// a reject rule), so clients get a connection refused at once, as
// kube-proxy's reject rule gives them; a UDP port likewise (port
// unreachable). LoadBalancer Services are served on the node's own IPs,
// which are reported in status.loadBalancer.ingress. EnsureRBAC grants the
// proxy's identity what it needs.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/k3sm-dev/k3sm/internal/agent/trim"
)

// Defaults for the zero values of Config's durations.
const (
	DefaultDialTimeout    = 2 * time.Second
	DefaultUDPIdleTimeout = 30 * time.Second
	DefaultRetryInterval  = 10 * time.Second
)

// Component is the source of the proxy's Events.
const Component = "k3sm-proxy"

// Config configures a Proxy.
type Config struct {
	Client   kubernetes.Interface // credential of the user EnsureRBAC bound
	NodeName string               // endpoints with this nodeName are local
	// NodeIPs are where NodePort and LoadBalancer sockets listen; the
	// LoadBalancer ingress reports them.
	NodeIPs []netip.Addr
	// NodePortAddresses, when not empty, restricts NodePort sockets to the
	// NodeIPs inside one of these prefixes (kube-proxy's flag of the name).
	NodePortAddresses []netip.Prefix
	// Recorder receives Events on Services (a port that cannot be opened).
	// nil: Run records them through Client.
	Recorder record.EventRecorder
	Log      *slog.Logger // nil: slog.Default()
	// Dial connects to an endpoint ("tcp" or "udp"); the node passes one
	// that dials from the host network. nil: a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// APIServer is where this node reaches the apiserver. It serves
	// default/kubernetes while that Service's EndpointSlices list no
	// endpoint: the apiserver publishes none for a loopback advertise
	// address (its endpoint reconciler is off then), yet pods still reach
	// the API through the Service, as upstream clients expect.
	APIServer netip.AddrPort

	// Kernel, when set, serves ClusterIPs, externalIPs and non-loopback
	// NodePort and LoadBalancer frontends in the kernel (see inKernel);
	// loopback node addresses, session affinity and
	// loadBalancerSourceRanges stay on the relay. nil: the relay serves
	// everything.
	Kernel         Kernel
	KernelDebounce time.Duration // 0: DefaultKernelDebounce
	KernelResync   time.Duration // 0: DefaultKernelResync
	// PodRanges are the cluster's pod range(s): an externalIP inside one
	// is not served (netd refuses it, and it would take over a pod's
	// traffic).
	PodRanges []netip.Prefix
	// LocalAddrs lists the node's own addresses, where the relay may listen
	// on an externalIP (it adds none to an interface). nil: the addresses
	// of the host's interfaces.
	LocalAddrs func() ([]netip.Addr, error)

	DialTimeout    time.Duration // per endpoint attempt; 0: DefaultDialTimeout
	UDPIdleTimeout time.Duration // a UDP session without traffic ends; 0: DefaultUDPIdleTimeout
	RetryInterval  time.Duration // a socket that failed to open is tried again; 0: DefaultRetryInterval
}

// Proxy serves the Services of one node. Run it once.
type Proxy struct {
	cfg         Config
	log         *slog.Logger
	nodePortIPs []netip.Addr
	recorder    record.EventRecorder
	started     atomic.Bool

	ctx         context.Context // Run's; ends dials at shutdown
	queue       workqueue.TypedRateLimitingInterface[string]
	svcLister   corelisters.ServiceLister
	sliceLister discoverylisters.EndpointSliceLister

	services map[string]map[listenerKey]*frontend // by ns/name; the worker's alone

	hpMu      sync.Mutex
	hostPorts map[string][]HostPort                        // by pod ns/name
	hpQueue   workqueue.TypedRateLimitingInterface[string] // Run's queue, once it runs

	wg    sync.WaitGroup // accept loops, relays, UDP sessions
	conns connSet

	kernel *kernelState // the ClusterIPs Config.Kernel serves

	// onRelay, when set (by tests), sees both sides of each TCP relay.
	onRelay func(client, backend net.Conn)
	// kernelSent, when set (by tests), sees each set the kernel took.
	kernelSent func([]KernelService)
}

// New checks cfg and returns a Proxy ready to Run.
func New(cfg Config) (*Proxy, error) {
	if cfg.Client == nil || cfg.NodeName == "" {
		return nil, errors.New("proxy: Config needs Client and NodeName")
	}
	for _, ip := range cfg.NodeIPs {
		if !ip.IsValid() || ip.IsUnspecified() {
			return nil, fmt.Errorf("proxy: node IP %v is not a unicast address", ip)
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.UDPIdleTimeout <= 0 {
		cfg.UDPIdleTimeout = DefaultUDPIdleTimeout
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.KernelDebounce <= 0 {
		cfg.KernelDebounce = DefaultKernelDebounce
	}
	if cfg.KernelResync <= 0 {
		cfg.KernelResync = DefaultKernelResync
	}
	cfg.NodeIPs = unmapAll(cfg.NodeIPs)
	p := &Proxy{
		cfg:       cfg,
		log:       cfg.Log.With("component", "proxy"),
		recorder:  cfg.Recorder,
		services:  map[string]map[listenerKey]*frontend{},
		hostPorts: map[string][]HostPort{},
		kernel:    newKernelState(),
	}
	for _, ip := range cfg.NodeIPs {
		if len(cfg.NodePortAddresses) == 0 || slices.ContainsFunc(cfg.NodePortAddresses, func(pr netip.Prefix) bool { return pr.Contains(ip) }) {
			p.nodePortIPs = append(p.nodePortIPs, ip)
		}
	}
	return p, nil
}

func unmapAll(ips []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.Unmap())
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out)
}

// Run watches Services and EndpointSlices and keeps the sockets in line
// with them until ctx ends; then it closes every socket and connection and
// returns nil once all of its goroutines are gone. It returns an error at
// once when the informers cannot sync.
func (p *Proxy) Run(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("proxy: Run called twice")
	}
	p.ctx = ctx
	if p.recorder == nil {
		eb := record.NewBroadcaster(record.WithContext(ctx))
		eb.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.cfg.Client.CoreV1().Events("")})
		defer eb.Shutdown()
		p.recorder = eb.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component, Host: p.cfg.NodeName})
	}
	p.queue = workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer p.queue.ShutDown()
	p.startHostPorts()

	// No resync: every change arrives as an event, and failed sockets are
	// retried through the queue. The caches keep no managed fields, which
	// the proxy never reads.
	factory := informers.NewSharedInformerFactoryWithOptions(p.cfg.Client, 0, informers.WithTransform(trim.ManagedFields))
	svcInf := factory.Core().V1().Services()
	sliceInf := factory.Discovery().V1().EndpointSlices()
	p.svcLister, p.sliceLister = svcInf.Lister(), sliceInf.Lister()
	// The handlers cannot fail on a factory that has not started.
	svcReg, _ := svcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.enqueueService,
		UpdateFunc: func(_, obj any) { p.enqueueService(obj) },
		DeleteFunc: p.enqueueService,
	})
	sliceReg, _ := sliceInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: p.enqueueSlice,
		UpdateFunc: func(old, obj any) {
			p.enqueueSlice(old) // the service-name label may have changed
			p.enqueueSlice(obj)
		},
		DeleteFunc: p.enqueueSlice,
	})
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	// The kernel's first set waits for the queue's first pass, so a
	// restarted node does not clear every Service for a moment.
	synced := make(chan struct{})
	var kernel sync.WaitGroup
	kctx, kcancel := context.WithCancel(ctx)
	if p.cfg.Kernel != nil {
		kernel.Go(func() { p.runKernel(kctx, synced) })
	}
	defer kernel.Wait()
	defer kcancel() // before the Wait: an early return ends the flusher too
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("proxy: %v informer did not sync", typ)
		}
	}
	p.log.Info("service proxy running", "node", p.cfg.NodeName, "nodeIPs", p.cfg.NodeIPs, "mode", p.Mode())

	// Every Service known at the sync is queued once the handlers have
	// seen the initial lists: when the queue has been through that many
	// keys, the kernel set is whole.
	if !cache.WaitForCacheSync(ctx.Done(), svcReg.HasSynced, sliceReg.HasSynced) {
		return nil
	}
	initial := p.queue.Len()
	var worker sync.WaitGroup
	worker.Go(func() {
		n := 0
		if initial == 0 {
			close(synced)
		}
		for p.processNext(ctx) {
			if n++; n == initial {
				close(synced)
			}
		}
		if n < initial {
			close(synced)
		}
	})
	<-ctx.Done()
	p.queue.ShutDown()
	worker.Wait()
	for key := range p.services {
		p.removeService(key)
	}
	p.conns.closeAll()
	p.wg.Wait()
	return nil
}

func (p *Proxy) enqueueService(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		p.queue.Add(key)
	}
}

func (p *Proxy) enqueueSlice(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	if name := s.Labels[discoveryv1.LabelServiceName]; name != "" {
		p.queue.Add(s.Namespace + "/" + name)
	}
}

func (p *Proxy) processNext(ctx context.Context) bool {
	key, quit := p.queue.Get()
	if quit {
		return false
	}
	defer p.queue.Done(key)
	if err := p.sync(ctx, key); err != nil && ctx.Err() == nil {
		p.log.Warn("service proxy: will retry", "service", key, "err", err)
		p.queue.AddRateLimited(key)
		return true
	}
	p.queue.Forget(key)
	return true
}

// sync brings the sockets of one Service in line with its spec and
// endpoints. Sockets whose address stays are kept, with their connections
// and affinity; only their endpoints change.
func (p *Proxy) sync(ctx context.Context, key string) error {
	if pod, ok := strings.CutPrefix(key, hostPortKey); ok {
		return p.syncHostPorts(key, pod)
	}
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := p.svcLister.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		p.removeService(key)
		return nil
	} else if err != nil {
		return err
	}
	var eps []*discoveryv1.EndpointSlice
	if handled(svc) {
		eps, err = p.sliceLister.EndpointSlices(ns).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name}))
		if err != nil {
			return err
		}
	}
	specs := desiredFrontends(svc, eps, p.cfg.NodeName, p.cfg.NodeIPs, p.nodePortIPs)
	if svc.Namespace == metav1.NamespaceDefault && svc.Name == "kubernetes" && p.cfg.APIServer.IsValid() {
		for i := range specs {
			if len(specs[i].endpoints) == 0 && specs[i].kind == kindClusterIP {
				specs[i].endpoints = []netip.AddrPort{p.cfg.APIServer}
			}
		}
	}
	if len(specs) == 0 {
		p.removeService(key)
		return nil
	}
	want := make(map[listenerKey]frontendSpec, len(specs))
	var inKernel []KernelService
	var onNode []frontendSpec // to the kernel once the relay holds their port
	var local []netip.Addr    // the node's addresses, read once the relay needs them
	localRead := false
	for _, s := range specs {
		ip := s.key.addr.Addr()
		if s.kind == kindExternalIP && slices.ContainsFunc(p.cfg.PodRanges, func(r netip.Prefix) bool { return r.Contains(ip) }) {
			p.recorder.Eventf(svc, corev1.EventTypeWarning, "ExternalIPRefused",
				"externalIP %s is inside the pod range; it is not served (choose an address outside %v)", ip, p.cfg.PodRanges)
			continue
		}
		if p.inKernel(s) {
			if s.kind != kindNodePort && s.kind != kindLoadBalancer {
				inKernel = append(inKernel, kernelService(s))
				continue
			}
			// The relay still opens its socket on the node address: it
			// holds the port against the host's processes (which the DNAT
			// would otherwise take from them; a PortInUse Event and the
			// address left out of the ingress when one has it) and serves
			// until the kernel has the rule.
			onNode = append(onNode, s)
		}
		if s.kind == kindExternalIP {
			// The relay listens on an externalIP only where it is the
			// node's own: it adds no address to the host (that would take
			// the address from whoever has it on the network).
			if !localRead {
				if local, err = p.localAddrs(); err != nil {
					return fmt.Errorf("the node's addresses, for externalIPs: %w", err)
				}
				localRead = true
			}
			if !slices.Contains(local, ip) {
				continue
			}
		}
		want[s.key] = s
	}
	fronts, retry := p.applyFrontends(key, want, func(k listenerKey, s frontendSpec, err error) {
		p.log.Warn("service proxy: cannot listen; retrying", "service", key, "port", s.portName, "address", k.String(), "err", err)
		p.recorder.Eventf(svc, corev1.EventTypeWarning, listenFailReason(err),
			"cannot listen on %s for %s port %s: %v; retrying every %s", k, s.kind, portLabel(s), err, p.cfg.RetryInterval)
	})
	for _, s := range onNode {
		if f := fronts[s.key]; f != nil && f.failed == nil && (f.tcp != nil || f.udp != nil) {
			inKernel = append(inKernel, kernelService(s))
		}
	}
	p.kernel.set(key, inKernel)
	if retry {
		p.queue.AddAfter(key, p.cfg.RetryInterval)
	}
	if ownsLoadBalancer(svc) {
		return p.syncIngress(ctx, svc, ingressIPs(p.cfg.NodeIPs, fronts))
	}
	return nil
}

// applyFrontends makes key's sockets those of want: sockets whose address
// stays are kept, with their connections and affinity; only their endpoints
// change. failed hears of a socket that cannot listen, once per error;
// retry: one could not.
func (p *Proxy) applyFrontends(key string, want map[listenerKey]frontendSpec, failed func(listenerKey, frontendSpec, error)) (fronts map[listenerKey]*frontend, retry bool) {
	fronts = p.services[key]
	if fronts == nil {
		fronts = map[listenerKey]*frontend{}
		p.services[key] = fronts
	}
	for k, f := range fronts {
		if _, ok := want[k]; !ok {
			f.shut()
			delete(fronts, k)
		}
	}
	for k, s := range want {
		f := fronts[k]
		if f == nil {
			f = &frontend{p: p, key: k, svc: key, pool: newPool()}
			fronts[k] = f
		}
		if err := f.update(s); err != nil {
			retry = true
			if f.failed == nil || f.failed.Error() != err.Error() {
				failed(k, s, err)
			}
			f.failed = err
		} else if f.failed != nil {
			p.log.Info("service proxy: listening now", "service", key, "address", k.String())
			f.failed = nil
		}
	}
	return fronts, retry
}

func listenFailReason(err error) string {
	if errors.Is(err, syscall.EADDRINUSE) {
		return "PortInUse"
	}
	return "ListenFailed"
}

// localAddrs lists the node's own addresses.
func (p *Proxy) localAddrs() ([]netip.Addr, error) {
	if p.cfg.LocalAddrs != nil {
		ips, err := p.cfg.LocalAddrs()
		return unmapAll(ips), err
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

func portLabel(s frontendSpec) string {
	if s.portName == "" {
		return fmt.Sprintf("%d", s.key.addr.Port())
	}
	return fmt.Sprintf("%q", s.portName)
}

func (p *Proxy) removeService(key string) {
	for _, f := range p.services[key] {
		f.shut()
	}
	delete(p.services, key)
	p.kernel.set(key, nil)
}

// frontend is one listening socket of a Service and what it relays to.
// Its socket fields belong to the worker; the pool and allow list are read
// by the serving goroutines.
type frontend struct {
	p     *Proxy
	key   listenerKey
	svc   string // ns/name
	kind  kind
	pool  *pool
	allow atomic.Pointer[[]netip.Prefix] // nil: every source

	tcp    *net.TCPListener
	udp    *udpFront
	failed error // why the socket could not be opened; nil when it is fine
}

// update applies s: the socket is open while there are endpoints and
// closed while there are none. The error is from opening it.
func (f *frontend) update(s frontendSpec) error {
	f.kind = s.kind
	if s.allow == nil {
		f.allow.Store(nil)
	} else {
		f.allow.Store(&s.allow)
	}
	f.pool.set(s.endpoints, s.affinity)
	if len(s.endpoints) == 0 {
		f.shut()
		return nil
	}
	if f.udp != nil {
		f.udp.dropSessionsNotIn(s.endpoints)
	}
	if f.tcp != nil || f.udp != nil {
		return nil
	}
	return f.open()
}

// allowed reports whether a client at addr may use this frontend.
func (f *frontend) allowed(addr netip.Addr) bool {
	allow := f.allow.Load()
	return allow == nil || slices.ContainsFunc(*allow, func(pr netip.Prefix) bool { return pr.Contains(addr) })
}

func (f *frontend) open() error {
	// ClusterIPs need not be assigned to an interface yet (the network
	// helper routes the Service range), so their bind may be non-local.
	lc := listenConfig(f.kind == kindClusterIP)
	switch f.key.proto {
	case corev1.ProtocolTCP:
		ln, err := lc.Listen(f.p.ctx, "tcp", f.key.addr.String())
		if err != nil {
			return err
		}
		f.tcp = ln.(*net.TCPListener)
		f.p.wg.Go(func() { f.accept(f.tcp) })
	case corev1.ProtocolUDP:
		c, err := lc.ListenPacket(f.p.ctx, "udp", f.key.addr.String())
		if err != nil {
			return err
		}
		f.udp = newUDPFront(f, c.(*net.UDPConn))
		f.p.wg.Go(f.udp.serve)
	}
	return nil
}

// shut closes the socket. Established TCP connections stay, as they would
// under kube-proxy; UDP sessions end with the socket they answer from.
func (f *frontend) shut() {
	if f.tcp != nil {
		f.tcp.Close()
		f.tcp = nil
	}
	if f.udp != nil {
		f.udp.close()
		f.udp = nil
	}
	f.failed = nil
}

// addrOf returns the IP of a socket address, IPv4 unmapped.
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
