package pod

import (
	"context"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// deadlineCheck is how often pods' activeDeadlineSeconds are checked.
const deadlineCheck = time.Second

const (
	reasonDeadlineExceeded  = "DeadlineExceeded"
	messageDeadlineExceeded = "Pod was active on the node longer than the specified deadline"
)

// enforceDeadlines fails each pod that has run longer than its
// activeDeadlineSeconds, as the kubelet does: its containers are stopped
// with the pod's grace period, and it stays Failed with reason
// DeadlineExceeded until it is deleted.
func (m *Manager) enforceDeadlines(ctx context.Context) {
	m.everyPod(ctx, deadlineCheck, func(p *managedPod) {
		if p.pastDeadline(time.Now()) {
			m.fail(p, reasonDeadlineExceeded, messageDeadlineExceeded, false)
		}
	})
}

// everyPod calls check on each pod every interval until ctx ends; the pods
// are listed under m.mu, check runs without it.
func (m *Manager) everyPod(ctx context.Context, interval time.Duration, check func(*managedPod)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		pods := make([]*managedPod, 0, len(m.pods))
		for _, p := range m.pods {
			pods = append(pods, p)
		}
		m.mu.Unlock()
		for _, p := range pods {
			check(p)
		}
	}
}

// pastDeadline: p runs and has been active longer than its deadline.
func (p *managedPod) pastDeadline(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.spec.ActiveDeadlineSeconds == nil || p.startTime.IsZero() || p.terminating || p.evicted != "" {
		return false
	}
	return now.Sub(p.startTime) >= time.Duration(p.spec.GetActiveDeadlineSeconds())*time.Second
}

// fail stops every container and leaves the pod Failed with reason and
// msg ("": Evicted) until it is deleted; noGrace stops them at once
// (an eviction).
func (m *Manager) fail(p *managedPod, reason, msg string, noGrace bool) {
	p.mu.Lock()
	if p.terminating || p.evicted != "" {
		p.mu.Unlock()
		return
	}
	p.evicted, p.failReason = msg, reason
	if noGrace {
		p.grace = 0
	}
	p.mu.Unlock()
	if reason == "" {
		m.log.Info("evicting pod", "pod", p.key(), "reason", msg)
		p.event(runtimev1.EventType_EVENT_TYPE_WARNING, "Evicted", "", msg)
	} else {
		m.log.Info("failing pod", "pod", p.key(), "reason", reason, "message", msg)
		p.event(runtimev1.EventType_EVENT_TYPE_WARNING, reason, "", msg)
	}
	p.stopAll()
	p.changedNotify()
	if err := p.save(); err != nil {
		m.log.Error("save failed pod", "pod", p.key(), "err", err)
	}
}
