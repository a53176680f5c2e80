package datastore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
)

// Record is <data-dir>/server/datastore.json, written at each start once
// the datastore passed its checks, before the apiserver starts: which
// database holds the cluster whose certificates this data directory keeps.
type Record struct {
	// Config is the datastore as the server was given it, password
	// included (the file is the server's alone, as its keys are), so that
	// `k3sm status` and `doctor` can ask the database whether it answers.
	Config Config `json:"config"`
}

// Kind is the recorded datastore's engine.
func (r Record) Kind() Kind { return r.Config.Kind() }

// Endpoint is the recorded endpoint without its password, for messages.
func (r Record) Endpoint() string { return r.Config.Redacted() }

// Recorded returns the record of l, if any. A data directory from before
// records existed whose SQLite file exists is recorded as SQLite.
func Recorded(l datadir.Layout) (Record, bool, error) {
	data, err := os.ReadFile(l.DatastoreFile())
	if errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(l.DBFile()); err == nil {
			return Record{}, true, nil // the embedded SQLite
		}
		return Record{}, false, nil
	} else if err != nil {
		return Record{}, false, err
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return Record{}, false, fmt.Errorf("%s: %w (it says which datastore holds the cluster; restore it from a backup or remove it if you know)", l.DatastoreFile(), err)
	}
	return r, true, nil
}

// Match refuses c when l's cluster lives in another datastore: started
// there, the apiserver would serve an empty cluster with this one's
// certificates, and the real one would look lost.
func Match(l datadir.Layout, c Config) error {
	r, ok, err := Recorded(l)
	if err != nil || !ok || r.Config.Identity() == c.Identity() {
		return err
	}
	fix := "start with --datastore-endpoint naming that database"
	if r.Kind() == SQLite {
		fix = "start without --datastore-endpoint (its SQLite file is " + l.DBFile() + ")"
	}
	return &FieldError{Flag: FlagEndpoint, Value: c.Redacted(),
		Problem: fmt.Sprintf("the cluster of --data-dir %s lives in %s, not %s", l.Root, r.Endpoint(), c.Identity()),
		Fix:     fix + ", or give a new --data-dir for a new cluster on " + c.Identity()}
}

// Write records c as the datastore holding l's cluster. It runs at every
// start: an unchanged record is not written (and synced) again.
func Write(l datadir.Layout, c Config) error {
	data, err := json.MarshalIndent(Record{Config: c}, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if old, err := os.ReadFile(l.DatastoreFile()); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return atomicfile.WriteFile(l.DatastoreFile(), data, 0o600)
}

// Answer reports whether the recorded datastore answers: the SQLite file
// exists, or the external database takes a connection within ctx.
func (r Record) Answer(ctx context.Context, l datadir.Layout) error {
	if r.Kind() == SQLite {
		_, err := os.Stat(l.DBFile())
		return err
	}
	return r.Config.Check(ctx)
}

// BackupTool names the database's own backup command, for messages that
// send an external datastore's users to it.
func (k Kind) BackupTool() string {
	switch k {
	case Postgres:
		return "pg_dump"
	case MySQL:
		return "mariadb-dump (mysqldump)"
	case Etcd:
		return "etcdctl snapshot save"
	}
	return "k3sm snapshot save"
}
