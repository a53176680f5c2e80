package pod

// Delete: a pod's graceful stop, then the removal of its files, network
// and cgroups.

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/volume"
)

// Delete stops the pod's containers (SIGTERM, grace, SIGKILL) and removes
// its files. grace overrides the pod's terminationGracePeriodSeconds.
func (m *Manager) Delete(ctx context.Context, uid string, grace *int64, wait bool) error {
	p := m.get(uid)
	if p == nil {
		return fmt.Errorf("pod %s: %w", uid, ErrNotFound)
	}
	p.mu.Lock()
	first := !p.terminating
	if first {
		p.terminating = true
		g := int64(30)
		if p.spec.TerminationGracePeriodSeconds != nil {
			g = p.spec.GetTerminationGracePeriodSeconds()
		}
		if grace != nil {
			g = *grace
		}
		if g < 0 {
			g = 0
		}
		p.grace = time.Duration(g) * time.Second
		p.graceEnd = time.Now().Add(p.grace)
		p.stopAll()
	}
	p.mu.Unlock()
	if first {
		p.changedNotify()
		go m.finishDelete(p)
	}
	if !wait {
		return nil
	}
	select {
	case <-p.removed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// finishDelete waits for the worker to stop every container, then removes
// the pod's directories.
func (m *Manager) finishDelete(p *managedPod) {
	select {
	case <-p.done:
	case <-m.ctx.Done():
		return // daemon stopping: the next daemon finishes the delete
	}
	m.releaseNetwork(p)
	m.removeCgroupsOf(p.uid)
	last := p.status()
	// A volume refresh may be writing a token or a ConfigMap into the pod's
	// directory right now: wait for it, and make later ones stop.
	p.volMu.Lock()
	p.volGone = true
	p.volMu.Unlock()
	// Nor may a late change write pod.json, which would make the
	// directory again (atomicfile makes missing parents).
	p.saveMu.Lock()
	p.stateGone = true
	p.saveMu.Unlock()
	p.mu.Lock()
	vols := p.spec.GetVolumes()
	p.mu.Unlock()
	for _, v := range vols {
		if v.GetEmptyDir().GetMemory() {
			if err := volume.UnmountTmpfs(p.volumeDir(v.GetName())); err != nil {
				m.log.Error("remove pod directory", "err", err)
			}
		}
	}
	if err := os.RemoveAll(p.dir); err != nil {
		m.log.Error("remove pod directory", "dir", p.dir, "err", err)
	}
	if err := os.RemoveAll(p.logDir()); err != nil {
		m.log.Error("remove pod logs", "pod", p.key(), "err", err)
	}
	m.mu.Lock()
	delete(m.pods, p.uid)
	m.mu.Unlock()
	m.hub.removed(last)
	close(p.removed)
	m.log.Info("pod removed", "pod", p.key())
}
