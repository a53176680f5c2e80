package pod

// pod.json: the pod's state on disk, written atomically after each
// change, from which a restarted daemon re-attaches.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
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
	Network      *PodNetwork          `json:"network,omitempty"`
	IDSlot       int32                `json:"idSlot,omitempty"`
	Containers   []persistedContainer `json:"containers"`
}

// save writes pod.json. The snapshot is taken under p.mu, the write is
// not: on ext4 a replace-by-rename may wait for writeback, and status reads
// must not wait for the disk.
func (p *managedPod) save() error { return p.saveWith(true) }

// saveWith is save, fsynced or only atomic.
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
	if err := writeState(filepath.Dir(state), filepath.Base(state), b, durable); err != nil {
		return err
	}
	p.written = seq
	return nil
}

// writeState replaces dir/name with b so that a crash leaves the old or the
// new content: temp file, fsync, rename, fsync of the directory. Not
// durable: no fsync, so only a crash of the daemon (not of the machine)
// is sure to leave one or the other.
func writeState(dir, name string, b []byte, durable bool) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if !durable {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// snapshotLocked serializes the pod's state. Caller holds p.mu.
func (p *managedPod) snapshotLocked() ([]byte, uint64, error) {
	spec, err := protojson.Marshal(p.spec)
	if err != nil {
		return nil, 0, err
	}
	pp := persistedPod{Spec: spec, StartTime: p.startTime, Terminating: p.terminating, GraceSeconds: int64(p.grace / time.Second), Evicted: p.evicted, IDSlot: p.idSlot.Load()}
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
