package pod

// pod.json: the pod's state on disk, written atomically after each
// change, from which a restarted daemon re-attaches.

import (
	"encoding/json"
	"io/fs"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

type persistedContainer struct {
	Name         string         `json:"name"`
	RestartCount int32          `json:"restartCount"`
	HasRun       bool           `json:"hasRun,omitempty"`
	StateDir     string         `json:"stateDir,omitempty"`
	ContainerID  string         `json:"containerID,omitempty"`
	State        containerState `json:"state"`
	Last         *terminated    `json:"last,omitempty"`
	ImageID      string         `json:"imageID,omitempty"`
	ImageDigest  string         `json:"imageDigest,omitempty"`
	RootImage    string         `json:"rootImage,omitempty"`
	Sandboxed    bool           `json:"sandboxed,omitempty"`
}

type persistedPod struct {
	Spec         json.RawMessage      `json:"spec"`
	StartTime    time.Time            `json:"startTime"`
	Terminating  bool                 `json:"terminating,omitempty"`
	GraceSeconds int64                `json:"graceSeconds,omitempty"`
	Evicted      string               `json:"evicted,omitempty"`
	FailReason   string               `json:"failReason,omitempty"`
	Network      *PodNetwork          `json:"network,omitempty"`
	IDSlot       int32                `json:"idSlot,omitempty"`
	Containers   []persistedContainer `json:"containers"`
}

// save writes pod.json. The snapshot is taken under p.mu, the write is
// not: on ext4 a replace-by-rename may wait for writeback, and status reads
// must not wait for the disk.
func (p *managedPod) save() error { return p.saveWith(true) }

// saveWith is save, fsynced (atomicfile.WriteFile) or only atomic
// (atomicfile.WriteFileNoSync).
func (p *managedPod) saveWith(durable bool) error {
	p.mu.Lock()
	b, seq, err := p.snapshotLocked()
	p.mu.Unlock()
	if err != nil {
		return err
	}
	return p.write(b, seq, durable)
}

// write stores snapshot seq unless a newer one was stored already.
func (p *managedPod) write(b []byte, seq uint64, durable bool) error {
	p.saveMu.Lock()
	defer p.saveMu.Unlock()
	if seq <= p.written {
		return nil
	}
	state := p.m.dirs().PodStateFile(p.uid)
	if p.stateGone {
		// What the missing directory answered before atomicfile, which
		// makes missing parents, wrote pod.json: callers ignore it.
		return &fs.PathError{Op: "write", Path: state, Err: fs.ErrNotExist}
	}
	writeFile := atomicfile.WriteFileNoSync
	if durable {
		writeFile = atomicfile.WriteFile
	}
	if err := writeFile(state, b, 0o600); err != nil {
		return err
	}
	p.written = seq
	return nil
}

// snapshotLocked serializes the pod's state. Caller holds p.mu.
func (p *managedPod) snapshotLocked() ([]byte, uint64, error) {
	spec, err := protojson.Marshal(p.spec)
	if err != nil {
		return nil, 0, err
	}
	pp := persistedPod{Spec: spec, StartTime: p.startTime, Terminating: p.terminating, GraceSeconds: int64(p.grace / time.Second), Evicted: p.evicted, FailReason: p.failReason, IDSlot: p.idSlot.Load()}
	if p.net.IP != "" {
		pn := p.net
		pp.Network = &pn
	}
	for _, c := range p.all() {
		pp.Containers = append(pp.Containers, persistedContainer{Name: c.spec.GetName(), RestartCount: c.restartCount, HasRun: c.hasRun,
			StateDir: c.stateDir, ContainerID: c.containerID, State: c.state, Last: c.last, ImageID: c.imageID,
			ImageDigest: c.imageDigest, RootImage: c.rootImage, Sandboxed: c.sandboxed})
	}
	b, err := json.MarshalIndent(pp, "", " ")
	if err != nil {
		return nil, 0, err
	}
	p.saveSeq++
	return b, p.saveSeq, nil
}
