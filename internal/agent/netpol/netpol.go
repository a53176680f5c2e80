// Package netpol owns turning NetworkPolicies into per-pod allow lists for
// this node's pods. It watches NetworkPolicies, every pod of the cluster
// (peers may be anywhere) and Namespaces (their labels), resolves the
// selectors of every policy that selects a pod on this node to the
// current addresses of the pods they match, and named ports to numbers,
// and hands each pod's result to an Applier (the runtime, which passes it
// on to k3sm-netd). It sends only what changed, shortly after the last
// change, and everything again periodically, so a restarted runtime or
// netd is repaired. Traffic between a pod and its node is always allowed
// (the data path's choice, as upstream plugins do); what is not enforced
// is in docs/networkpolicy.md.
package netpol

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/k3sm-dev/k3sm/internal/agent/trim"
)

// Policy is what one pod may receive and send.
type Policy struct {
	Ingress, Egress Direction
}

// Direction: not isolated, everything passes; isolated, only what a rule
// allows (no rules: nothing), and replies to connections allowed.
type Direction struct {
	Isolated bool
	Rules    []Rule
}

// Rule allows any of Peers (none: any address) on any of Ports (none: any
// protocol and port).
type Rule struct {
	Peers []Peer
	Ports []Port
}

// Peer is an IPv4 range less its exceptions; selected pods are their
// addresses, merged into the fewest prefixes.
type Peer struct {
	CIDR   netip.Prefix
	Except []netip.Prefix
}

// Port is a destination port of Protocol (TCP, UDP or SCTP): Port 0 is
// every port, EndPort (when set) ends a range.
type Port struct {
	Protocol      corev1.Protocol
	Port, EndPort uint16
}

// Applier puts a pod's policy in place.
type Applier interface {
	SetPolicy(ctx context.Context, uid string, p Policy) error
}

// Errors an Applier wraps to tell the controller what to do next.
var (
	// ErrUnsupported: this node cannot enforce the policy; retrying does
	// not help until the policy changes.
	ErrUnsupported = errors.New("NetworkPolicy is not enforced on this node")
	// ErrNoNetwork: the pod has no network (yet, or any more); it is tried
	// again.
	ErrNoNetwork = errors.New("pod has no network")
)

// Defaults for Config's zero durations.
const (
	DefaultDebounce = 100 * time.Millisecond
	DefaultResync   = time.Minute
	retryAfter      = 2 * time.Second
)

// Config configures a Controller.
type Config struct {
	Client   kubernetes.Interface // may list and watch what EnsureRBAC grants
	NodeName string
	Applier  Applier
	Log      *slog.Logger // nil: slog.Default()
	Debounce time.Duration
	Resync   time.Duration
}

// Controller keeps the policies of this node's pods applied. Run it once.
type Controller struct {
	cfg  Config
	log  *slog.Logger
	kick chan struct{}

	pods       cache.SharedIndexInformer
	namespaces cache.SharedIndexInformer
	policies   cache.SharedIndexInformer
	factory    informers.SharedInformerFactory

	sent  map[string]Policy // by UID: what the Applier accepted last
	fresh map[string]bool   // sent since the last full resync
}

// New builds a controller; Run starts it.
func New(cfg Config) *Controller {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	c := &Controller{cfg: cfg, log: cfg.Log, kick: make(chan struct{}, 1), sent: map[string]Policy{}, fresh: map[string]bool{}}
	// Every pod of the cluster is held: the fields nobody reads go.
	c.factory = informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithTransform(trim.ManagedFields))
	c.pods = c.factory.Core().V1().Pods().Informer()
	c.namespaces = c.factory.Core().V1().Namespaces().Informer()
	c.policies = c.factory.Networking().V1().NetworkPolicies().Informer()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.trigger() },
		UpdateFunc: func(any, any) { c.trigger() },
		DeleteFunc: func(any) { c.trigger() },
	}
	for _, inf := range []cache.SharedIndexInformer{c.pods, c.namespaces, c.policies} {
		inf.AddEventHandler(h)
	}
	return c
}

func (c *Controller) trigger() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run syncs until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.pods.HasSynced, c.namespaces.HasSynced, c.policies.HasSynced) {
		return ctx.Err()
	}
	c.log.Info("enforcing NetworkPolicy for this node's pods", "node", c.cfg.NodeName)
	resync := time.NewTicker(c.cfg.Resync)
	defer resync.Stop()
	var retry <-chan time.Time
	for {
		if c.sync(ctx) {
			retry = time.After(retryAfter)
		} else {
			retry = nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-resync.C:
			clear(c.fresh)
		case <-retry:
		case <-c.kick:
			// Let a burst of changes (a Deployment's pods, a namespace's
			// relabel) settle into one computation.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(c.cfg.Debounce):
			}
			select {
			case <-c.kick:
			default:
			}
		}
	}
}

func (c *Controller) snapshot() state {
	var st state
	for _, o := range c.pods.GetStore().List() {
		st.pods = append(st.pods, o.(*corev1.Pod))
	}
	st.namespaces = map[string]labels.Set{}
	for _, o := range c.namespaces.GetStore().List() {
		ns := o.(*corev1.Namespace)
		st.namespaces[ns.Name] = labels.Set(ns.Labels)
	}
	for _, o := range c.policies.GetStore().List() {
		st.policies = append(st.policies, o.(*networkingv1.NetworkPolicy))
	}
	return st
}

// sync applies what changed (and, after a resync, everything) and reports
// whether something is to be tried again.
func (c *Controller) sync(ctx context.Context) (retry bool) {
	st := c.snapshot()
	names := map[string]string{}
	for _, p := range st.pods {
		if p.Spec.NodeName == c.cfg.NodeName {
			names[string(p.UID)] = p.Namespace + "/" + p.Name
		}
	}
	want := compute(c.cfg.NodeName, st, func(np *networkingv1.NetworkPolicy, err error) {
		c.log.Warn("NetworkPolicy not applied: its podSelector does not parse", "policy", np.Namespace+"/"+np.Name, "err", err)
	})
	for uid := range c.sent {
		if _, ok := want[uid]; !ok {
			delete(c.sent, uid) // the pod is gone: its network and policy went with it
			delete(c.fresh, uid)
		}
	}
	for uid, p := range want {
		prev, had := c.sent[uid]
		changed := !had || !reflect.DeepEqual(prev, p)
		if !changed && c.fresh[uid] {
			continue
		}
		err := c.cfg.Applier.SetPolicy(ctx, uid, p)
		switch {
		case err == nil:
		case errors.Is(err, ErrUnsupported):
			if changed && (p.Ingress.Isolated || p.Egress.Isolated) {
				c.log.Warn("NetworkPolicy not enforced", "pod", names[uid], "err", err)
			}
		case errors.Is(err, ErrNoNetwork):
			c.log.Debug("pod has no network yet", "pod", names[uid])
			retry = true
			continue
		default:
			if ctx.Err() == nil {
				c.log.Error("applying a pod's NetworkPolicy", "pod", names[uid], "err", err)
			}
			retry = true
			continue
		}
		if changed && (p.Ingress.Isolated || p.Egress.Isolated || prev.Ingress.Isolated || prev.Egress.Isolated) {
			c.log.Info("pod NetworkPolicy applied", "pod", names[uid], "ingressIsolated", p.Ingress.Isolated, "ingressRules", len(p.Ingress.Rules),
				"egressIsolated", p.Egress.Isolated, "egressRules", len(p.Egress.Rules))
		}
		c.sent[uid], c.fresh[uid] = p, true
	}
	return retry
}
