package podspec

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// sharedFixture is SharedSource over a fake clientset that counts GETs and
// open watches of ConfigMaps.
type sharedFixture struct {
	c       *fake.Clientset
	src     Source
	gets    atomic.Int32
	watches atomic.Int32
}

func newSharedFixture(t *testing.T, objs ...runtime.Object) *sharedFixture {
	t.Helper()
	f := &sharedFixture{c: fake.NewClientset(objs...)}
	f.c.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		f.gets.Add(1)
		return false, nil, nil
	})
	f.c.PrependWatchReactor("configmaps", func(k8stesting.Action) (bool, watch.Interface, error) {
		f.watches.Add(1)
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f.src = SharedSource(ctx, f.c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return f
}

func cm(name, rv, value string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}, Data: map[string]string{"k": value}}
}

func TestSharedSourceReadsOnceAndFollows(t *testing.T) {
	f := newSharedFixture(t, cm("kube-root-ca.crt", "1", "a"), cm("other", "1", "x"))
	ctx := context.Background()

	// A burst: 50 pods read it at once, one GET.
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := f.src.ConfigMap(ctx, "ns", "kube-root-ca.crt")
			if err == nil && v.Data["k"] != "a" {
				err = fmt.Errorf("data %v", v.Data)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := f.gets.Load(); n != 1 {
		t.Fatalf("%d GETs for 50 reads, want 1", n)
	}
	poll.UntilNil(t, 5*time.Second, "the watch", func() error {
		if f.watches.Load() != 1 {
			return fmt.Errorf("%d watches", f.watches.Load())
		}
		return nil
	})

	// A reader's copy is its own.
	v, _ := f.src.ConfigMap(ctx, "ns", "kube-root-ca.crt")
	v.Data["k"] = "changed by a reader"

	// An update arrives through the watch; another object's does not count.
	if _, err := f.c.CoreV1().ConfigMaps("ns").Update(ctx, cm("other", "2", "y"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.CoreV1().ConfigMaps("ns").Update(ctx, cm("kube-root-ca.crt", "3", "b"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.UntilNil(t, 5*time.Second, "the update", func() error {
		v, err := f.src.ConfigMap(ctx, "ns", "kube-root-ca.crt")
		if err != nil || v.Data["k"] != "b" {
			return fmt.Errorf("%v %v", v, err)
		}
		return nil
	})
	if n := f.gets.Load(); n != 1 {
		t.Fatalf("%d GETs, want 1: the update came through the watch", n)
	}

	// Deleted: the copy goes, and a read asks the API again.
	if err := f.c.CoreV1().ConfigMaps("ns").Delete(ctx, "kube-root-ca.crt", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.UntilNil(t, 5*time.Second, "NotFound after the delete", func() error {
		_, err := f.src.ConfigMap(ctx, "ns", "kube-root-ca.crt")
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("got %v", err)
		}
		return nil
	})
	// A missing object is not kept: it is asked for each time.
	before := f.gets.Load()
	f.src.ConfigMap(ctx, "ns", "kube-root-ca.crt")
	if f.gets.Load() != before+1 {
		t.Fatalf("a NotFound was cached")
	}
	if _, err := f.c.CoreV1().ConfigMaps("ns").Create(ctx, cm("kube-root-ca.crt", "5", "c"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, err := f.src.ConfigMap(ctx, "ns", "kube-root-ca.crt"); err != nil || v.Data["k"] != "c" {
		t.Fatalf("after re-creation: %v %v", v, err)
	}
}

func TestSharedSourceDropsIdleCopies(t *testing.T) {
	c := fake.NewClientset(cm("a", "1", "a"))
	var gets atomic.Int32
	c.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	api := apiSource{c}
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	stopped := make(chan struct{}, 1)
	s := newShared(ctx, "configmap", 40*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)), api.ConfigMap,
		func(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
			w, err := c.CoreV1().ConfigMaps(ns).Watch(ctx, o)
			go func() { <-ctx.Done(); stopped <- struct{}{} }()
			return w, err
		}, (*corev1.ConfigMap).DeepCopy)
	s.now = clock
	if _, err := s.get(ctx, "ns", "a"); err != nil {
		t.Fatal(err)
	}
	s.get(ctx, "ns", "a")
	if gets.Load() != 1 {
		t.Fatalf("%d GETs, want 1", gets.Load())
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the idle copy's watch was not stopped")
	}
	poll.UntilNil(t, 5*time.Second, "the idle copy dropped", func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.m) != 0 {
			return fmt.Errorf("%d kept", len(s.m))
		}
		return nil
	})
	s.get(ctx, "ns", "a")
	if gets.Load() != 2 {
		t.Fatalf("%d GETs, want 2 after the copy was dropped", gets.Load())
	}
}
