package podspec

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestIsTransientAPIError(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"timeout", apierrors.NewTimeoutError("slow", 1), true},
		{"server timeout", apierrors.NewServerTimeout(gr, "get", 1), true},
		{"internal", apierrors.NewInternalError(errors.New("boom")), true},
		{"unavailable", apierrors.NewServiceUnavailable("down"), true},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), true},
		{"no API status (connection refused)", errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"), true},
		{"not found", apierrors.NewNotFound(gr, "cm"), false},
		{"forbidden", apierrors.NewForbidden(gr, "cm", errors.New("no")), false},
		{"invalid", apierrors.NewBadRequest("bad"), false},
		{"nil", nil, false},
	} {
		if got := isTransientAPIError(tc.err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
