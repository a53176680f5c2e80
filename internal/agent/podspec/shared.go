package podspec

import (
	"context"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// SharedIdle is how long a shared ConfigMap or Secret outlives its last
// read. Running pods' volumes are re-read every refresh period, which keeps
// theirs; one read only for a pod's env goes after this.
const SharedIdle = 2 * time.Minute

// SharedSource is the node's Source: it reads a ConfigMap or Secret once,
// however many pods reference it (kube-root-ca.crt, in every pod's
// service-account volume, is read once for a burst, not once per pod), and
// keeps that copy current with a watch of that one object, which is what
// the Node authorizer lets a node do (get, list and watch by name of an
// object a pod bound to it references, as the kubelet's watch-based
// manager does). A copy nobody read for SharedIdle is dropped with its
// watch; a watch that fails or ends in an error drops the copy, so the next
// read is a GET again. Claims, volumes and tokens are read from the API
// every time.
func SharedSource(ctx context.Context, c kubernetes.Interface, log *slog.Logger) Source {
	api := apiSource{c}
	s := &sharedSource{
		Source: api,
		configMaps: newShared(ctx, "configmap", SharedIdle, log, api.ConfigMap,
			func(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
				return c.CoreV1().ConfigMaps(ns).Watch(ctx, o)
			}, (*corev1.ConfigMap).DeepCopy),
		secrets: newShared(ctx, "secret", SharedIdle, log, api.Secret,
			func(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
				return c.CoreV1().Secrets(ns).Watch(ctx, o)
			}, (*corev1.Secret).DeepCopy),
	}
	return s
}

type sharedSource struct {
	Source
	configMaps *shared[*corev1.ConfigMap]
	secrets    *shared[*corev1.Secret]
}

func (s *sharedSource) ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	return s.configMaps.get(ctx, ns, name)
}

func (s *sharedSource) Secret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	return s.secrets.get(ctx, ns, name)
}

// object is what shared keeps: a ConfigMap or a Secret.
type object interface {
	comparable
	GetName() string
	GetResourceVersion() string
}

// shared keeps one copy of each object of one kind that was read, current
// through a watch of that object.
type shared[T object] struct {
	kind  string
	idle  time.Duration
	log   *slog.Logger
	fetch func(ctx context.Context, ns, name string) (T, error)
	watch func(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error)
	copy  func(T) T
	now   func() time.Time

	mu sync.Mutex
	m  map[string]*sharedEntry[T]
}

type sharedEntry[T object] struct {
	ready chan struct{} // closed once v or err is set
	v     T
	err   error
	used  time.Time
	stop  context.CancelFunc // ends the watch
}

func newShared[T object](ctx context.Context, kind string, idle time.Duration, log *slog.Logger,
	fetch func(ctx context.Context, ns, name string) (T, error),
	w func(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error),
	copy func(T) T) *shared[T] {
	s := &shared[T]{kind: kind, idle: idle, log: log, fetch: fetch, watch: w, copy: copy, now: time.Now, m: map[string]*sharedEntry[T]{}}
	go s.expire(ctx)
	return s
}

// get returns a copy of the object: the shared one once it was read, or
// the answer of the one GET that reads it (concurrent readers wait for it).
func (s *shared[T]) get(ctx context.Context, ns, name string) (T, error) {
	key := ns + "/" + name
	s.mu.Lock()
	e := s.m[key]
	if e != nil {
		e.used = s.now()
		s.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		}
		s.mu.Lock()
		v, err := e.v, e.err
		s.mu.Unlock()
		if err != nil {
			var zero T
			return zero, err
		}
		return s.copy(v), nil
	}
	e = &sharedEntry[T]{ready: make(chan struct{}), used: s.now()}
	s.m[key] = e
	s.mu.Unlock()

	v, err := s.fetch(ctx, ns, name)
	var zero T
	s.mu.Lock()
	if err != nil || v == zero {
		// Not kept: NotFound, Forbidden and failures are asked again.
		e.err = err
		s.drop(key, e)
		s.mu.Unlock()
		close(e.ready)
		return v, err
	}
	e.v = v
	wctx, stop := context.WithCancel(context.Background())
	e.stop = stop
	s.mu.Unlock()
	close(e.ready)
	go s.follow(wctx, key, e, ns, name, v.GetResourceVersion())
	return s.copy(v), nil
}

// drop forgets e if it is still key's entry; with s.mu held.
func (s *shared[T]) drop(key string, e *sharedEntry[T]) {
	if s.m[key] == e {
		delete(s.m, key)
	}
	if e.stop != nil {
		e.stop()
	}
}

// follow keeps e current from the object's watch, from resource version rv
// on; the server ends a watch every few minutes, and it is then resumed
// from the last version seen. Anything else ends the sharing of e.
func (s *shared[T]) follow(ctx context.Context, key string, e *sharedEntry[T], ns, name, rv string) {
	defer func() {
		s.mu.Lock()
		s.drop(key, e)
		s.mu.Unlock()
	}()
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	for ctx.Err() == nil {
		w, err := s.watch(ctx, ns, metav1.ListOptions{FieldSelector: sel, ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			if ctx.Err() == nil {
				s.log.Debug("shared object: watch refused; reading it with GETs", "kind", s.kind, "object", key, "err", err)
			}
			return
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added, watch.Modified:
				v, ok := ev.Object.(T)
				if !ok {
					w.Stop()
					return
				}
				if v.GetName() != name {
					continue // another object: a watch that ignores the selector (client-go's fake)
				}
				rv = v.GetResourceVersion()
				s.mu.Lock()
				e.v = v
				s.mu.Unlock()
			case watch.Bookmark:
				if o, ok := ev.Object.(interface{ GetResourceVersion() string }); ok {
					rv = o.GetResourceVersion()
				}
			case watch.Deleted:
				if o, ok := ev.Object.(T); ok && o.GetName() != name {
					continue
				}
				w.Stop()
				return
			default: // an Error (the version is too old)
				w.Stop()
				return
			}
		}
	}
}

// expire drops the copies nobody read for s.idle, and all of them when ctx
// ends.
func (s *shared[T]) expire(ctx context.Context) {
	t := time.NewTicker(s.idle / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			for k, e := range s.m {
				s.drop(k, e)
			}
			s.mu.Unlock()
			return
		case <-t.C:
		}
		s.mu.Lock()
		for k, e := range s.m {
			if s.now().Sub(e.used) > s.idle {
				select {
				case <-e.ready:
					s.drop(k, e)
				default: // its GET is under way
				}
			}
		}
		s.mu.Unlock()
	}
}
