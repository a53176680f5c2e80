package apilb

import (
	"context"
	"net"
	"slices"
	"strconv"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/k3sm-dev/k3sm/internal/agent/trim"
)

// The Service whose endpoints are the apiservers, and its port.
const (
	apiService   = "kubernetes"
	apiNamespace = metav1.NamespaceDefault
	apiPortName  = "https"
)

// Follow keeps lb's list equal to the endpoints of the `kubernetes` Service
// in `default` (every ready address of its EndpointSlices labelled
// kubernetes.io/service-name=kubernetes, port named "https"), watching
// through client (which should itself dial through lb). It returns when ctx
// ends. It never calls Update with an empty list: while the Service has no
// ready endpoint, lb keeps the servers it knows.
func Follow(ctx context.Context, client kubernetes.Interface, lb *LB) {
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: apiService})
	f := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(apiNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }),
		informers.WithTransform(trim.ManagedFields))
	inf := f.Discovery().V1().EndpointSlices()
	kick := make(chan struct{}, 1)
	trigger := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    trigger,
		UpdateFunc: func(_, o any) { trigger(o) },
		DeleteFunc: trigger,
	}); err != nil {
		lb.log.Error("cannot follow the apiservers' endpoints; the apiserver list stays as configured", "err", err)
		return
	}
	lister := inf.Lister().EndpointSlices(apiNamespace)
	f.Start(ctx.Done())
	defer f.Shutdown()
	// Act on the whole list only: a partial one would drop servers (and
	// close their connections).
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return
	}
	empty := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
		eps, err := lister.List(sel)
		if err != nil {
			continue // a cache lister does not fail
		}
		servers := readyServers(eps)
		if len(servers) == 0 {
			if !empty {
				lb.log.Warn("the kubernetes Service has no ready apiserver endpoint; keeping the known servers", "servers", lb.Servers())
			}
			empty = true
			continue
		}
		empty = false
		lb.Update(servers)
	}
}

// readyServers returns host:port of every ready endpoint of eps on the
// port named https, sorted, without duplicates.
func readyServers(eps []*discoveryv1.EndpointSlice) []string {
	var out []string
	for _, es := range eps {
		port := int32(0)
		for _, p := range es.Ports {
			if p.Name != nil && *p.Name == apiPortName && p.Port != nil {
				port = *p.Port
				break
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range es.Endpoints {
			// A nil Ready is unknown, to be taken as ready.
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			// Addresses beyond the first have no defined meaning.
			if len(ep.Addresses) == 0 {
				continue
			}
			if s, err := canonical(net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(port)))); err == nil {
				out = append(out, s)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
