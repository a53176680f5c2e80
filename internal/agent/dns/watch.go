package dns

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// watcher holds the informer caches the index is built from. Pods are not
// watched: pod records are derived from the queried name ("pods insecure"
// in CoreDNS terms), which spares the node a cache of every pod in the
// cluster.
type watcher struct {
	factory  informers.SharedInformerFactory
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	synced   []cache.InformerSynced
}

func newWatcher(c kubernetes.Interface, changed func()) *watcher {
	// The caches keep only what the index reads: no managed fields or
	// annotations (last-applied-configuration can be most of a Service).
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTransform(strip))
	svc := f.Core().V1().Services()
	eps := f.Discovery().V1().EndpointSlices()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		UpdateFunc: func(any, any) { changed() },
		DeleteFunc: func(any) { changed() },
	}
	w := &watcher{factory: f, services: svc.Lister(), slices: eps.Lister()}
	for _, inf := range []cache.SharedIndexInformer{svc.Informer(), eps.Informer()} {
		_, _ = inf.AddEventHandler(h)
		w.synced = append(w.synced, inf.HasSynced)
	}
	return w
}

func strip(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
		m.SetAnnotations(nil)
	}
	return obj, nil
}

func (w *watcher) start(ctx context.Context) { w.factory.Start(ctx.Done()) }

func (w *watcher) stop() { w.factory.Shutdown() }

func (w *watcher) waitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), w.synced...)
}

func (w *watcher) list() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svcs, _ := w.services.List(labels.Everything())
	slices, _ := w.slices.List(labels.Everything())
	return svcs, slices
}
