package pod

// Publishing a change: a pod's state is persisted and told to watchers
// (the hub); its events go to them too.

import (
	"os"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// changedNotify persists and publishes a change.
func (p *managedPod) changedNotify() {
	p.mu.Lock()
	p.revision++
	b, seq, err := p.snapshotLocked()
	p.mu.Unlock()
	p.m.hub.changed(p.uid)
	if err == nil {
		err = p.write(b, seq, true)
	}
	if err != nil && !os.IsNotExist(err) {
		p.m.log.Error("persist pod state", "pod", p.key(), "err", err)
	}
}

// update applies f to the container under the pod lock, then publishes.
func (p *managedPod) update(f func()) {
	p.mu.Lock()
	f()
	p.mu.Unlock()
	p.changedNotify()
}

func (p *managedPod) event(t runtimev1.EventType, reason, container, msg string) {
	p.m.hub.emit(&runtimev1.PodEvent{PodUid: p.uid, Namespace: p.namespace, Name: p.name,
		Type: t, Reason: reason, Message: msg, Container: container})
}
