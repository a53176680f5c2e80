package pod

// Re-attach: a pod rebuilt from pod.json at daemon start, its containers
// adopted from their shims (or found ended, or never started).

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// load rebuilds a pod from pod.json and re-attaches to its shims. It
// returns how many containers are still running.
func (m *Manager) load(uid string) (*managedPod, int, error) {
	b, err := os.ReadFile(m.dirs().PodStateFile(uid))
	if err != nil {
		return nil, 0, err
	}
	var pp persistedPod
	if err := json.Unmarshal(b, &pp); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", filepath.Base(m.dirs().PodStateFile(uid)), err)
	}
	spec := &runtimev1.PodSpec{}
	if err := protojson.Unmarshal(pp.Spec, spec); err != nil {
		return nil, 0, fmt.Errorf("%s spec: %w", filepath.Base(m.dirs().PodStateFile(uid)), err)
	}
	if spec.GetUid() != uid {
		return nil, 0, fmt.Errorf("%s names uid %q, not its directory's", filepath.Base(m.dirs().PodStateFile(uid)), spec.GetUid())
	}
	p := m.newPod(spec)
	p.startTime = pp.StartTime
	p.terminating = pp.Terminating
	p.grace = time.Duration(pp.GraceSeconds) * time.Second
	p.graceEnd = time.Now().Add(p.grace)
	p.evicted = pp.Evicted
	p.failReason = pp.FailReason
	p.idSlot.Store(pp.IDSlot)
	if pp.Network != nil {
		p.net = *pp.Network
	}
	if p.terminating || p.evicted != "" {
		p.stopAll()
	}
	byName := map[string]persistedContainer{}
	for _, pc := range pp.Containers {
		byName[pc.Name] = pc
	}
	nRunning := 0
	for _, c := range p.all() {
		pc, ok := byName[c.spec.GetName()]
		if !ok {
			continue
		}
		c.restartCount, c.hasRun, c.stateDir, c.containerID = pc.RestartCount, pc.HasRun, pc.StateDir, pc.ContainerID
		c.state, c.last, c.imageID, c.imageDigest, c.rootImage = pc.State, pc.Last, pc.ImageID, pc.ImageDigest, pc.RootImage
		c.sandboxed = pc.Sandboxed
		if c.stateDir == "" || (c.state.Running == nil && c.state.Waiting == nil) {
			continue
		}
		if c.state.Waiting != nil && !c.hasRun {
			continue
		}
		proc, alive, err := m.cfg.Starter.Attach(c.stateDir)
		// Waiting after a recorded end of this attempt (c.last: a start
		// failure, then back-off) is a restart to come, whatever the shim
		// left.
		current := c.last == nil || c.last.ContainerID != c.containerID
		if err != nil && c.state.Waiting != nil && current && errors.Is(err, ErrNotStarted) {
			// The daemon died while it started this attempt, before its
			// process ran (waiting for a start slot, cloning the root,
			// spawning the shim): the next attempt is this one again, not
			// a restart.
			c.unstarted = true
			continue
		}
		if err != nil {
			if c.state.Running != nil {
				m.log.Warn("attach to shim failed", "pod", p.key(), "container", c.spec.GetName(), "err", err)
				now := time.Now()
				c.state = containerState{Terminated: &terminated{ExitCode: 255, Reason: "ExitStatusUnknown", Message: "shim state lost: " + err.Error(),
					StartedAt: c.state.Running.StartedAt, FinishedAt: now, ContainerID: c.containerID}}
			}
			continue
		}
		// A waiting container only had a live attempt if the daemon died
		// between starting it and recording that; a running one is adopted
		// either way (a dead shim's Wait answers with the recorded exit).
		if c.state.Waiting != nil && !alive {
			continue
		}
		c.proc = proc
		if c.state.Running == nil {
			c.state = containerState{Running: &running{StartedAt: proc.StartedAt()}}
			if c.spec.GetLifecycle().GetPostStart() == nil {
				// The daemon died before it recorded the start, so before
				// it announced it (with a postStart hook the container
				// stays Waiting after Started: it may have).
				name := c.spec.GetName()
				p.event(runtimev1.EventType_EVENT_TYPE_NORMAL, "Created", name, "Created container "+name)
				p.event(runtimev1.EventType_EVENT_TYPE_NORMAL, "Started", name, "Started container "+name)
			}
		}
		if alive {
			nRunning++
		}
	}
	return p, nRunning, nil
}
