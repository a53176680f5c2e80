package pod

import "fmt"

// Evict evicts a pod as the kubelet's eviction manager does (the path the
// emptyDir sizeLimit takes): an Evicted event with msg, every container
// stopped with no grace period, then phase Failed with reason Evicted and
// msg. The pod stays until it is deleted. A pod already terminating or
// evicted is left as it is.
func (m *Manager) Evict(uid, msg string) error {
	p := m.get(uid)
	if p == nil {
		return fmt.Errorf("pod %s: %w", uid, ErrNotFound)
	}
	m.evict(p, msg)
	return nil
}
