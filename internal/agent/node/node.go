// Package node owns the k3sm node: a Virtual Kubelet that registers this
// machine as a Node under its own system:node:<name> identity, hands the
// pods scheduled to it to the runtime daemon (through the api/runtime/v1
// contract only, translated by internal/agent/podspec), keeps what it knows
// of each pod (provider.go: one podState per uid), reports their status and
// events the way the kubelet does (status.go, reconcile.go), refreshes their
// files volumes (refresh.go), reports DiskPressure and collects images
// (disk.go), and serves the kubelet API (logs, exec, attach, port-forward,
// stats; kubeletapi.go) with the apiserver's authentication and
// authorization.
package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"k8s.io/component-base/metrics/legacyregistry"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/localpath"
	"github.com/k3sm-dev/k3sm/internal/agent/mesh"
	"github.com/k3sm-dev/k3sm/internal/agent/metrics"
	"github.com/k3sm-dev/k3sm/internal/agent/netpol"
	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	"github.com/k3sm-dev/k3sm/internal/agent/trim"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	netdclient "github.com/k3sm-dev/k3sm/internal/netd/client"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"github.com/k3sm-dev/k3sm/internal/version"
	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// Taint keeps workloads that did not ask for native pods off k3sm nodes
// started with it (NodeConfig.Taint).
var Taint = corev1.Taint{Key: "k3sm.io/provider", Value: "native", Effect: corev1.TaintEffectNoSchedule}

// Config is what one node runs with: the role config the server wrote,
// and what only the process itself sets.
type Config struct {
	roleconfig.NodeConfig
	Workers int // pod workers (0: 16)
	Log     *slog.Logger
}

// Run registers the node and serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Workers == 0 {
		cfg.Workers = 16
	}
	log := cfg.Log
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("node kubeconfig: %w", err)
	}
	rc.UserAgent = "k3sm-node/" + version.Version
	rc.QPS, rc.Burst = 100, 200
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	rt, err := client.Dial(cfg.RuntimeSocket)
	if err != nil {
		return err
	}
	defer rt.Close()
	var info *runtimev1.GetRuntimeInfoResponse
	if cfg.Instant {
		info = &runtimev1.GetRuntimeInfoResponse{RuntimeName: "instant", RuntimeVersion: version.Version, Os: goruntime.GOOS, Arch: goruntime.GOARCH,
			CpuCores: int64(goruntime.NumCPU()), MemoryBytes: 8 << 30, MaxPods: 1000}
	} else {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		info, err = rt.WaitReady(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("runtime daemon at %s: %w", cfg.RuntimeSocket, err)
		}
	}

	// Everything before this point is local (no API, no pods): it overlaps
	// the apiserver's start-up when the server starts the node early.
	if cfg.StartGate != "" {
		if err := waitStartGate(ctx, cfg.StartGate); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}

	eb := record.NewBroadcaster()
	eb.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kc.CoreV1().Events("")})
	defer eb.Shutdown()
	recorder := eb.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.Name})

	var provider *Provider
	podNetwork := info.GetPodNetwork() == "netns"
	// With a pod network the node serves Services and DNS itself, and pods
	// reach the API through the kubernetes Service, as upstream; without
	// one, through the API's own address on the node's network.
	services := podNetwork && cfg.APIServiceIP != "" && cfg.ClusterDNS != ""
	apiEnv := podspec.APIServerEnv(rc.Host)
	var podDNS *podspec.DNS
	var svcFactory informers.SharedInformerFactory
	if services {
		// Service links (enableServiceLinks) as the kubelet gives them.
		svcFactory = informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithTransform(trim.ManagedFields))
		apiEnv = podspec.ServiceLinksEnv(svcFactory.Core().V1().Services().Lister(),
			podspec.APIServerEnv("https://"+net.JoinHostPort(cfg.APIServiceIP, "443")))
		podDNS = &podspec.DNS{Server: cfg.ClusterDNS, Domain: cfg.ClusterDomain, HostResolvConf: podspec.HostResolvConfPath()}
	}
	translatorConfig := podspec.Config{Source: podspec.SharedSource(ctx, kc, log), NodeIP: cfg.IP, PodNetwork: podNetwork, DNS: podDNS, ServiceEnv: apiEnv,
		EphemeralFailed: func(pod *corev1.Pod, container string, err error) {
			log.Warn("ephemeral container left out", "pod", pod.Namespace+"/"+pod.Name, "container", container, "err", err)
			provider.event(pod, container, corev1.EventTypeWarning, "Failed", "Error: "+err.Error())
		}}
	if cfg.DataDir != "" {
		translatorConfig.ProtectedDirs = []string{cfg.DataDir}
	}
	translatorConfig.Allocatable = nodeObject(cfg, info).Status.Allocatable
	provider = newProvider(rt, podspec.New(translatorConfig), cfg.IP, recorder, log, cfg.Instant)
	provider.nodeName = cfg.Name
	provider.instantWrites = cfg.Instant && cfg.InstantWrites
	provider.podNetwork = podNetwork
	provider.remove = func(ns, name string, uid types.UID) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err := kc.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0), Preconditions: metav1.NewUIDPreconditions(string(uid))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			log.Warn("removing terminated pod", "pod", ns+"/"+name, "err", err)
		}
	}
	if !cfg.Instant {
		// Learn what the runtime already runs before Virtual Kubelet asks,
		// so restarted nodes re-adopt live pods instead of recreating them.
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		list, err := rt.Runtime.ListPods(lctx, &runtimev1.ListPodsRequest{})
		cancel()
		if err != nil {
			return fmt.Errorf("runtime ListPods: %w", err)
		}
		for _, st := range list.Pods {
			provider.update(st)
		}
		if cfg.DataDir != "" {
			provider.pos = loadEventPos(datadir.New(cfg.DataDir).RuntimeEventsFile(), log)
			defer provider.pos.flush()
		}
		go provider.watch(ctx)
		go provider.refreshVolumes(ctx, VolumeRefreshPeriod)
	}
	if cfg.LocalPathKubeconfig != "" {
		if err := startLocalPath(ctx, cfg); err != nil {
			return err
		}
	}

	nodeSpec := nodeObject(cfg, info)
	health := &nodeHealth{rt: rt, instant: cfg.Instant}
	if !cfg.Instant && cfg.DataDir != "" {
		if health.disk, err = newDiskManager(cfg.Disk, cfg.DataDir, cfg.Name, grpcDiskRuntime{rt.Runtime, rt.Images}, recorder, log); err != nil {
			return err
		}
		health.disk.setNode(nodeSpec, nil)
		provider.memoryEvicted = health.disk.memoryEvicted
	}
	nc, err := vknode.NewNodeController(health, nodeSpec, kc.CoreV1().Nodes(),
		vknode.WithNodeEnableLeaseV1(nodeutil.NodeLeaseV1Client(kc), vknode.DefaultLeaseDuration))
	if err != nil {
		return err
	}

	podFactory := informers.NewSharedInformerFactoryWithOptions(kc, time.Minute, nodeutil.PodInformerFilter(cfg.Name))
	podLister := podFactory.Core().V1().Pods().Lister()
	provider.apiUID = func(ns, name string) (types.UID, bool) {
		pod, err := podLister.Pods(ns).Get(name)
		if err != nil {
			return "", false
		}
		return pod.UID, true
	}
	provider.apiPod = func(ns, name string) (*corev1.Pod, bool) {
		pod, err := podLister.Pods(ns).Get(name)
		return pod, err == nil
	}
	provider.writeStatus = func(ctx context.Context, pod *corev1.Pod) error {
		_, err := kc.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	}
	// The pod controller wants these informers, but with our own env
	// resolution they are never started: a node may not list Secrets and
	// ConfigMaps cluster-wide, only GET those its pods reference.
	unused := informers.NewSharedInformerFactory(kc, 0)
	pc, err := vknode.NewPodController(vknode.PodControllerConfig{
		PodClient:                 kc.CoreV1(),
		PodInformer:               podFactory.Core().V1().Pods(),
		EventRecorder:             recorder,
		Provider:                  provider,
		ConfigMapInformer:         unused.Core().V1().ConfigMaps(),
		SecretInformer:            unused.Core().V1().Secrets(),
		ServiceInformer:           unused.Core().V1().Services(),
		SkipDownwardAPIResolution: true,
		// Virtual Kubelet's default queues admit 10 items per second after a
		// burst of 100, which held a burst of 100 pods' status updates back
		// for seconds; conflicts retry quickly too.
		SyncPodsFromKubernetesRateLimiter:    queueLimiter(),
		DeletePodsFromKubernetesRateLimiter:  queueLimiter(),
		SyncPodStatusFromProviderRateLimiter: queueLimiter(),
	})
	if err != nil {
		return err
	}

	srv, err := serveKubeletAPI(cfg, kc, provider, podFactory)
	if err != nil {
		return err
	}
	defer srv.Close()
	// Without its metrics API the node still runs pods: log, do not fail.
	if err := metrics.Serve(ctx, cfg.Metrics, metrics.Deps{Client: kc, Config: rc, NodeName: cfg.Name, Log: log,
		Pods: podFactory.Core().V1().Pods().Lister(), Source: metrics.RuntimeSource{Runtime: rt.Runtime}}); err != nil {
		log.Error("metrics.k8s.io not served", "err", err)
	}

	podFactory.Start(ctx.Done())
	if svcFactory != nil {
		// Pods started before the Services are known would miss their
		// service links (the kubelet waits too).
		svcFactory.Start(ctx.Done())
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		svcFactory.WaitForCacheSync(sctx.Done())
		cancel()
	}
	go provider.reconcileStatuses(ctx, ReconcilePeriod)
	errc := make(chan error, 5)
	go func() { errc <- nc.Run(ctx) }()
	select {
	case <-nc.Ready():
	case err := <-errc:
		return fmt.Errorf("node controller: %w", err)
	case <-ctx.Done():
		return nil
	}
	go func() { errc <- pc.Run(ctx, cfg.Workers) }()
	if podNetwork {
		// Pods have addresses of their own: enforce their NetworkPolicies.
		np := netpol.New(netpol.Config{Client: kc, NodeName: cfg.Name, Applier: netpol.RuntimeApplier{Runtime: rt.Runtime}, Log: log.With("component", "netpol")})
		go func() { errc <- np.Run(ctx) }()
		if cfg.Mesh.Port != 0 {
			// Pods on other nodes: the WireGuard mesh (it waits for the
			// pod range and netd itself).
			dyn, err := dynamic.NewForConfig(rc)
			if err != nil {
				return err
			}
			mc := mesh.New(mesh.Config{Dynamic: dyn, Nodes: kc.CoreV1().Nodes(), NodeName: cfg.Name, NodeIP: cfg.IP,
				ListenPort: uint16(cfg.Mesh.Port), ClusterCIDR: cfg.ClusterCIDR,
				Netd: netdclient.New(cfg.Mesh.NetdSocket), Log: log.With("component", "mesh")})
			go func() { errc <- mc.Run(ctx) }()
		}
		go func() {
			if !syncPodCIDR(ctx, kc.CoreV1().Nodes(), cfg.Name, rt.Runtime, log) || !services {
				return
			}
			// The Service range is the node's now (netd routed it):
			// the proxy and DNS can bind their ClusterIPs.
			if err := serveServices(ctx, cfg, rc.Host, kc, recorder, provider, log); err != nil {
				errc <- err
			}
		}()
	}
	if health.disk != nil {
		go health.disk.run(ctx)
	}
	log.Info("node registered", "node", cfg.Name, "ip", cfg.IP, "kubeletPort", cfg.KubeletPort, "runtime", info.RuntimeName+" "+info.RuntimeVersion)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
}

func nodeObject(cfg Config, info *runtimev1.GetRuntimeInfoResponse) *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(info.CpuCores, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(info.MemoryBytes, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(info.MaxPods, resource.DecimalSI),
	}
	host, _ := os.Hostname()
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: cfg.Name,
			Labels: map[string]string{
				corev1.LabelOSStable:           info.Os,
				corev1.LabelArchStable:         info.Arch,
				corev1.LabelHostname:           cfg.Name,
				corev1.LabelInstanceTypeStable: "k3sm",
			},
		},
		Spec: nodeSpecFor(cfg),
		Status: corev1.NodeStatus{
			Phase:           corev1.NodeRunning,
			Capacity:        capacity,
			Allocatable:     capacity.DeepCopy(),
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: cfg.IP}, {Type: corev1.NodeHostName, Address: host}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(cfg.KubeletPort)}},
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion:          version.Kubernetes + "+k3sm",
				OperatingSystem:         info.Os,
				Architecture:            info.Arch,
				KernelVersion:           info.KernelVersion,
				OSImage:                 osImage(),
				ContainerRuntimeVersion: info.RuntimeName + "://" + info.RuntimeVersion,
			},
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "k3sm node is posting ready status"),
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, reasonNoMemoryPressure, messageNoMemoryPressure),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, reasonNoDiskPressure, messageNoDiskPressure),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "node has sufficient PID available"),
				cond(corev1.NodeNetworkUnavailable, corev1.ConditionFalse, "RouteCreated", "pods use the host network"),
			},
		},
	}
}

// nodeSpecFor is the spec the node registers with. The taint applies at
// registration only: NodeRestriction forbids a node to change its own
// taints later, so the server reconciles them on an existing Node.
func nodeSpecFor(cfg Config) corev1.NodeSpec {
	if cfg.Taint {
		return corev1.NodeSpec{Taints: []corev1.Taint{Taint}}
	}
	return corev1.NodeSpec{}
}

func osImage() string {
	data, err := os.ReadFile("/etc/os-release")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				if uq, err := strconv.Unquote(v); err == nil {
					return uq
				}
				return v
			}
		}
	}
	return goruntime.GOOS
}

// nodeHealth is the Node side of Virtual Kubelet (its NodeProvider): it
// answers health pings from the runtime and passes DiskPressure changes on.
type nodeHealth struct {
	rt      *client.Client
	instant bool
	disk    *diskManager // reports DiskPressure changes; nil with Instant
}

func (n *nodeHealth) Ping(ctx context.Context) error {
	if n.instant {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := n.rt.Runtime.GetRuntimeInfo(ctx, &runtimev1.GetRuntimeInfoRequest{})
	return err
}

func (n *nodeHealth) NotifyNodeStatus(_ context.Context, cb func(*corev1.Node)) {
	if n.disk != nil {
		n.disk.mu.Lock()
		n.disk.notify = cb
		n.disk.mu.Unlock()
	}
}

// serveKubeletAPI starts the TLS kubelet API. As the kubelet in webhook
// mode, clients authenticate with a certificate from the client CA (the
// apiserver does) or a bearer token (TokenReview), never anonymously, and
// every request is authorized through SubjectAccessReview.
func serveKubeletAPI(cfg Config, kc kubernetes.Interface, provider *Provider, pods informers.SharedInformerFactory) (*http.Server, error) {
	caPEM, err := os.ReadFile(cfg.ClientCAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s: no certificates", cfg.ClientCAFile)
	}
	pair, err := tls.LoadX509KeyPair(cfg.ServingCert, cfg.ServingKey)
	if err != nil {
		return nil, err
	}
	caProvider, err := dynamiccertificates.NewStaticCAContent("client-ca", caPEM)
	if err != nil {
		return nil, err
	}
	auth, err := nodeutil.WebhookAuth(kc, cfg.Name, func(c *nodeutil.WebhookAuthConfig) error {
		c.AuthnConfig.ClientCertificateCAContentProvider = caProvider
		return nil
	})
	if err != nil {
		return nil, err
	}
	lister := pods.Core().V1().Pods().Lister()
	handler := api.PodHandler(api.PodHandlerConfig{
		RunInContainer:    provider.RunInContainer,
		AttachToContainer: provider.AttachToContainer,
		PortForward:       provider.PortForward,
		GetContainerLogs:  provider.GetContainerLogs,
		GetPods:           provider.GetPods,
		GetPodsFromKubernetes: func(context.Context) ([]*corev1.Pod, error) {
			return lister.List(labels.Everything())
		},
		GetStatsSummary:       provider.GetStatsSummary,
		GetMetricsResource:    provider.GetMetricsResource,
		StreamIdleTimeout:     4 * time.Hour,
		StreamCreationTimeout: 30 * time.Second,
	}, false)
	tc := &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	addr := net.JoinHostPort(cfg.IP, strconv.Itoa(cfg.KubeletPort))
	ln, err := tls.Listen("tcp", addr, tc)
	if err != nil {
		return nil, fmt.Errorf("kubelet API on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", provider.containerLogs)
	// The node process's own metrics (Go runtime, process, client-go), as
	// a kubelet serves its component metrics here: e2e's failure dumps and
	// Prometheus scrape configs read it through the apiserver's node proxy.
	mux.Handle("GET /metrics", legacyregistry.Handler())
	mux.Handle("/", handler)
	srv := &http.Server{Handler: nodeutil.WithAuth(auth, mux), ReadHeaderTimeout: 30 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Log.Error("kubelet API stopped", "err", err)
		}
	}()
	return srv, nil
}

// queueLimiter lets an item through at once the first time it is queued,
// retries a failing one from 10 ms up to 10 s, and lets 1000 items a
// second through overall. Virtual Kubelet asks the limiter for every
// queued item, not only for retries, so a plain exponential limiter would
// delay every pod's create and every status update by its base (5 ms).
func queueLimiter() workqueue.TypedRateLimiter[any] {
	return &retryLimiter{
		exp:    workqueue.NewTypedItemExponentialFailureRateLimiter[any](5*time.Millisecond, 10*time.Second),
		bucket: &workqueue.TypedBucketRateLimiter[any]{Limiter: rate.NewLimiter(rate.Limit(1000), 2000)},
	}
}

// retryLimiter: see queueLimiter. Virtual Kubelet forgets an item once it
// was handled, which starts it over.
type retryLimiter struct {
	exp, bucket workqueue.TypedRateLimiter[any]
}

func (l *retryLimiter) When(item any) time.Duration {
	first := l.exp.NumRequeues(item) == 0
	d, b := l.exp.When(item), l.bucket.When(item)
	if first {
		return b
	}
	return max(d, b)
}

func (l *retryLimiter) Forget(item any)          { l.exp.Forget(item) }
func (l *retryLimiter) NumRequeues(item any) int { return l.exp.NumRequeues(item) }

// startLocalPath runs the node's local-path provisioner with its own
// credential; it logs and keeps trying rather than taking the node down.
func startLocalPath(ctx context.Context, cfg Config) error {
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.LocalPathKubeconfig)
	if err != nil {
		return fmt.Errorf("local-path kubeconfig: %w", err)
	}
	rc.UserAgent = "k3sm-local-path/" + version.Version
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	p := &localpath.Provisioner{Client: kc, NodeName: cfg.Name, BaseDir: cfg.LocalPathDir, Log: cfg.Log.With("component", "local-path")}
	go func() {
		for ctx.Err() == nil {
			if err := p.Run(ctx); err != nil {
				cfg.Log.Error("local-path provisioner", "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}()
	return nil
}

// waitStartGate waits until the file gate exists: the server creates it
// once it has verified authorization (the fail-closed rule: nothing acts
// for users before). A stat every 10 ms costs nothing and adds at most
// 10 ms to "up".
func waitStartGate(ctx context.Context, gate string) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		_, err := os.Stat(gate)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("start gate: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
