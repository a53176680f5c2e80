package trim

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func TestManagedFields(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{"a": "b"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	got, err := ManagedFields(pod)
	if err != nil || got != pod || pod.ManagedFields != nil || pod.Annotations["a"] != "b" {
		t.Errorf("%v %v: %+v", got, err, pod.ObjectMeta)
	}
	// A tombstone has no metadata of its own: it passes unchanged.
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/p"}
	if got, err := ManagedFields(tomb); err != nil || got != tomb {
		t.Errorf("tombstone: %v %v", got, err)
	}
}
