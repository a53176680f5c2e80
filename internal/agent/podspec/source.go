package podspec

import (
	"context"
	"errors"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/k3sm-dev/k3sm/internal/backoff"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Source fetches the objects a pod references: ConfigMaps and Secrets (env,
// volumes, pull secrets), claims and their volumes, and service-account
// tokens. The Node authorizer lets a node read exactly those, one GET at a
// time, which is why the node uses no cluster-wide informers for them.
type Source interface {
	ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error)
	Secret(ctx context.Context, ns, name string) (*corev1.Secret, error)
	Claim(ctx context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error)
	Volume(ctx context.Context, name string) (*corev1.PersistentVolume, error)
	Token(ctx context.Context, ns, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error)
	// ClusterTrustBundles lists the bundles of signer (cluster-scoped:
	// the Node authorizer lets every node read them) whose labels match
	// selector.
	ClusterTrustBundles(ctx context.Context, signer string, selector labels.Selector) ([]certificatesv1.ClusterTrustBundle, error)
	ClusterTrustBundle(ctx context.Context, name string) (*certificatesv1.ClusterTrustBundle, error)
}

// apiSource reads from the API server with the node's own client, one GET
// a read (SharedSource shares ConfigMaps and Secrets on top of it).
type apiSource struct{ c kubernetes.Interface }

func (s apiSource) ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	return getAsNode(ctx, func() (*corev1.ConfigMap, error) {
		return s.c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	})
}
func (s apiSource) Secret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	return getAsNode(ctx, func() (*corev1.Secret, error) { return s.c.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}) })
}

func (s apiSource) Claim(ctx context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error) {
	return getAsNode(ctx, func() (*corev1.PersistentVolumeClaim, error) {
		return s.c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	})
}
func (s apiSource) Volume(ctx context.Context, name string) (*corev1.PersistentVolume, error) {
	return getAsNode(ctx, func() (*corev1.PersistentVolume, error) {
		return s.c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	})
}
func (s apiSource) ClusterTrustBundles(ctx context.Context, signer string, selector labels.Selector) ([]certificatesv1.ClusterTrustBundle, error) {
	list, err := getAsNode(ctx, func() (*certificatesv1.ClusterTrustBundleList, error) {
		return s.c.CertificatesV1().ClusterTrustBundles().List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
	})
	if err != nil {
		return nil, err
	}
	var out []certificatesv1.ClusterTrustBundle
	for _, b := range list.Items {
		if b.Spec.SignerName == signer {
			out = append(out, b)
		}
	}
	return out, nil
}

func (s apiSource) ClusterTrustBundle(ctx context.Context, name string) (*certificatesv1.ClusterTrustBundle, error) {
	return getAsNode(ctx, func() (*certificatesv1.ClusterTrustBundle, error) {
		return s.c.CertificatesV1().ClusterTrustBundles().Get(ctx, name, metav1.GetOptions{})
	})
}

func (s apiSource) Token(ctx context.Context, ns, sa string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return getAsNode(ctx, func() (*authenticationv1.TokenRequest, error) {
		return s.c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	})
}

// getAsNode retries Forbidden for a moment: the Node authorizer learns that a
// new pod references an object from its own watch, which can trail the pod
// reaching this node by a few milliseconds.
func getAsNode[T any](ctx context.Context, get func() (T, error)) (T, error) {
	const wait = 3 * time.Second
	// 50 ms doubling: the waits before the deadline are 50 ms ... 1.6 s
	// (3.15 s in all), so the cap at the whole wait is never reached.
	delay := backoff.Backoff{Initial: 50 * time.Millisecond, Max: wait}
	deadline := time.Now().Add(wait)
	for {
		v, err := get()
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(delay.Next()):
		}
	}
}

// isTransientAPIError: an answer that says nothing about the object asked
// for. NotFound, Forbidden (getAsNode already waited for the Node
// authorizer), Invalid and the like are answers; 5xx, 429 and timeouts are
// not, and neither is an error without an API status (connection refused,
// reset, a deadline).
func isTransientAPIError(err error) bool {
	if err == nil {
		return false
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		// Timeouts, internal errors and unavailability all carry a 5xx.
		return st.Status().Code >= 500 || apierrors.IsTooManyRequests(err)
	}
	return true
}

// transientSource notes the first transient error any read of a
// translation met, so that whatever error the translation ends with
// ("configmap not found", a FailedMount) is not taken for the pod's fault.
type transientSource struct {
	Source
	mu    sync.Mutex
	first error
}

func (s *transientSource) note(err error) {
	if isTransientAPIError(err) {
		s.mu.Lock()
		if s.first == nil {
			s.first = err
		}
		s.mu.Unlock()
	}
}

func (s *transientSource) seen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

func (s *transientSource) ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	v, err := s.Source.ConfigMap(ctx, ns, name)
	s.note(err)
	return v, err
}

func (s *transientSource) Secret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	v, err := s.Source.Secret(ctx, ns, name)
	s.note(err)
	return v, err
}

func (s *transientSource) Claim(ctx context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error) {
	v, err := s.Source.Claim(ctx, ns, name)
	s.note(err)
	return v, err
}

func (s *transientSource) Volume(ctx context.Context, name string) (*corev1.PersistentVolume, error) {
	v, err := s.Source.Volume(ctx, name)
	s.note(err)
	return v, err
}

func (s *transientSource) ClusterTrustBundles(ctx context.Context, signer string, selector labels.Selector) ([]certificatesv1.ClusterTrustBundle, error) {
	v, err := s.Source.ClusterTrustBundles(ctx, signer, selector)
	s.note(err)
	return v, err
}

func (s *transientSource) ClusterTrustBundle(ctx context.Context, name string) (*certificatesv1.ClusterTrustBundle, error) {
	v, err := s.Source.ClusterTrustBundle(ctx, name)
	s.note(err)
	return v, err
}

func (s *transientSource) Token(ctx context.Context, ns, sa string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	v, err := s.Source.Token(ctx, ns, sa, req)
	s.note(err)
	return v, err
}

// memoSource reads each ConfigMap and Secret once (one refresh round's).
type memoSource struct {
	Source
	mu sync.Mutex
	m  map[string]memoEntry
}

type memoEntry struct {
	v   any
	err error
}

func memo[T any](s *memoSource, key string, get func() (T, error)) (T, error) {
	s.mu.Lock()
	if e, ok := s.m[key]; ok {
		s.mu.Unlock()
		v, _ := e.v.(T)
		return v, e.err
	}
	s.mu.Unlock()
	v, err := get()
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]memoEntry{}
	}
	s.m[key] = memoEntry{v, err}
	s.mu.Unlock()
	return v, err
}

func (s *memoSource) ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	return memo(s, "cm/"+ns+"/"+name, func() (*corev1.ConfigMap, error) { return s.Source.ConfigMap(ctx, ns, name) })
}

func (s *memoSource) Secret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	return memo(s, "secret/"+ns+"/"+name, func() (*corev1.Secret, error) { return s.Source.Secret(ctx, ns, name) })
}
