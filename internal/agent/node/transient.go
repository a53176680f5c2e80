package node

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// transientError is a pod the node could not translate because the API did
// not answer (a timeout, a 5xx, a refused connection): nothing is wrong with
// the pod or what it references, so it is neither a CreateContainerConfigError
// nor a FailedMount. A running pod keeps its status; a pod not started yet is
// retried with backoff.
type transientError struct{ err error }

func (e *transientError) Error() string {
	return fmt.Sprintf("the API server did not answer (will retry): %v", e.err)
}
func (e *transientError) Unwrap() error { return e.err }

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

// isTransientRuntimeError: the runtime daemon did not take the call (it is
// restarting, or the call timed out); the same call is worth repeating.
func isTransientRuntimeError(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Canceled:
		return true
	}
	return false
}

// transientSource notes the first transient error any read of a
// translation met, so that whatever error the translation ends with
// ("configmap not found", a FailedMount) is not taken for the pod's fault.
type transientSource struct {
	objectSource
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

func (s *transientSource) configMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	v, err := s.objectSource.configMap(ctx, ns, name)
	s.note(err)
	return v, err
}

func (s *transientSource) secret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	v, err := s.objectSource.secret(ctx, ns, name)
	s.note(err)
	return v, err
}

func (s *transientSource) claim(ctx context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error) {
	v, err := s.objectSource.claim(ctx, ns, name)
	s.note(err)
	return v, err
}

func (s *transientSource) volume(ctx context.Context, name string) (*corev1.PersistentVolume, error) {
	v, err := s.objectSource.volume(ctx, name)
	s.note(err)
	return v, err
}

func (s *transientSource) token(ctx context.Context, ns, sa string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	v, err := s.objectSource.token(ctx, ns, sa, req)
	s.note(err)
	return v, err
}
