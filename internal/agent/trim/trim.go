// Package trim holds the informer transforms that drop from the agent's
// caches what it never reads.
package trim

import "k8s.io/apimachinery/pkg/api/meta"

// ManagedFields is an informer transform (informers.WithTransform,
// SharedInformer.SetTransform) that drops an object's managed fields:
// often the larger part of a cached object, and nothing in the agent reads
// them. Objects without metadata pass unchanged.
func ManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
