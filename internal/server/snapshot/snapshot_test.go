package snapshot

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/server/kinedb"
)

// cluster makes a data dir with a kine datastore (in WAL mode, as kine
// runs it), a server CA and an admin kubeconfig.
func cluster(t *testing.T) (datadir.Layout, *sql.DB) {
	t.Helper()
	l := datadir.New(t.TempDir())
	if err := os.MkdirAll(l.DBDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadOrCreateCA(l.TLSDir(), "server-ca", "test-ca"); err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFile(l.AdminKubeconfig(), []byte("admin-v1")); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+l.DBFile()+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, created INTEGER, deleted INTEGER,
		create_revision INTEGER, prev_revision INTEGER, lease INTEGER, value BLOB, old_value BLOB)`); err != nil {
		t.Fatal(err)
	}
	put(t, db, "/registry/configmaps/default/before")
	return l, db
}

func put(t *testing.T, db *sql.DB, key string) {
	t.Helper()
	if _, err := db.Exec(`INSERT INTO kine (name, deleted, value) VALUES (?, 0, 'x')`, key); err != nil {
		t.Fatal(err)
	}
}

func has(t *testing.T, l datadir.Layout, key string) bool {
	t.Helper()
	d, err := kinedb.Open(l.DBFile())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, ok, err := d.Value(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func clock(start time.Time) func() time.Time {
	return func() time.Time { start = start.Add(time.Minute); return start }
}

func TestSaveRestoreWhileOpen(t *testing.T) {
	ctx := context.Background()
	l, db := cluster(t)
	now := clock(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
	m, _, err := Save(ctx, SaveOptions{DataDir: l.Root, Prefix: "manual", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "manual-20261201-100100" || m.ServerCAFingerprint == "" || !strings.HasPrefix(m.ServerCAFingerprint, "sha256:") {
		t.Fatalf("metadata %+v", m)
	}
	for _, f := range []string{"metadata.json", "server/db/state.db", "server/tls/server-ca.crt", "server/tls/server-ca.key", "admin.kubeconfig"} {
		st, err := os.Stat(filepath.Join(l.SnapshotsDir(), m.Name, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	// State after the snapshot, with the WAL still holding it.
	put(t, db, "/registry/configmaps/default/after")
	if err := pki.WriteFile(l.AdminKubeconfig(), []byte("admin-v2")); err != nil {
		t.Fatal(err)
	}
	// A server running on the data dir blocks the restore.
	release, err := controlplane.LockDataDir(l.Root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, RestoreOptions{DataDir: l.Root, Name: m.Name}); err == nil || !strings.Contains(err.Error(), "stop it first") {
		t.Fatalf("restore beside a server: %v", err)
	}
	release()
	db.Close() // the server is stopped
	res, err := Restore(ctx, RestoreOptions{DataDir: l.Root, Name: m.Name})
	if err != nil {
		t.Fatal(err)
	}
	if !has(t, l, "/registry/configmaps/default/before") || has(t, l, "/registry/configmaps/default/after") {
		t.Fatal("after the restore: want the object from before the snapshot and not the one after it")
	}
	if b, _ := os.ReadFile(l.AdminKubeconfig()); string(b) != "admin-v1" {
		t.Fatalf("admin.kubeconfig = %q, want the snapshot's", b)
	}
	if !strings.HasPrefix(res.PreRestore, PreRestorePrefix+"-") {
		t.Fatalf("pre-restore snapshot %q", res.PreRestore)
	}
	// The pre-restore snapshot has the state the restore replaced.
	if _, err := Restore(ctx, RestoreOptions{DataDir: l.Root, Name: res.PreRestore}); err != nil {
		t.Fatal(err)
	}
	if !has(t, l, "/registry/configmaps/default/after") {
		t.Fatal("the pre-restore snapshot lost the newer object")
	}
}

func TestRestoreRefusesAnotherCluster(t *testing.T) {
	ctx := context.Background()
	a, _ := cluster(t)
	b, _ := cluster(t)
	m, _, err := Save(ctx, SaveOptions{DataDir: a.Root})
	if err != nil {
		t.Fatal(err)
	}
	opts := RestoreOptions{DataDir: b.Root, Dir: a.SnapshotsDir(), Name: m.Name}
	if _, err := Restore(ctx, opts); err == nil || !strings.Contains(err.Error(), "another cluster") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("want a refusal naming --force, got %v", err)
	}
	opts.Force = true
	if _, err := Restore(ctx, opts); err != nil {
		t.Fatal(err)
	}
	fa, _ := Fingerprint(a.Root)
	fb, _ := Fingerprint(b.Root)
	if fa != fb {
		t.Fatal("a forced restore must bring the snapshot's CA")
	}
	// Into an empty data dir (disaster recovery): nothing to refuse.
	empty := t.TempDir()
	if _, err := Restore(ctx, RestoreOptions{DataDir: empty, Dir: a.SnapshotsDir(), Name: m.Name}); err != nil {
		t.Fatal(err)
	}
	if err := CheckCluster(empty); err != nil {
		t.Fatal(err)
	}
}

func TestRetentionAndErrors(t *testing.T) {
	ctx := context.Background()
	l, _ := cluster(t)
	now := clock(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
	for range 4 {
		if _, _, err := Save(ctx, SaveOptions{DataDir: l.Root, Prefix: ScheduledPrefix, Keep: 2, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := Save(ctx, SaveOptions{DataDir: l.Root, Prefix: "manual", Keep: 2, Now: now}); err != nil {
		t.Fatal(err)
	}
	all, err := List(l.SnapshotsDir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range all {
		names = append(names, m.Name)
	}
	want := "scheduled-20261201-100300 scheduled-20261201-100400 manual-20261201-100500"
	if strings.Join(names, " ") != want {
		t.Fatalf("snapshots %v, want %s", names, want)
	}
	if err := CheckCluster(t.TempDir()); err == nil || !strings.Contains(err.Error(), "k3sm server --data-dir") {
		t.Fatalf("no cluster: %v", err)
	}
	if _, err := Restore(ctx, RestoreOptions{DataDir: l.Root, Name: "nope"}); err == nil || !strings.Contains(err.Error(), "snapshot ls") {
		t.Fatalf("unknown snapshot: %v", err)
	}
	if _, err := Restore(ctx, RestoreOptions{DataDir: l.Root, Name: "../x"}); err == nil {
		t.Fatal("a path is not a snapshot name")
	}
	if err := ValidPrefix("Bad Name"); err == nil {
		t.Fatal("want an invalid name")
	}
}

// TestExternalDatastoreRefused: a cluster on --datastore-endpoint has no
// SQLite file to copy, and a SQLite snapshot restored over it would leave a
// data dir pointing at two datastores: both are refused, naming the
// database's own tool.
func TestExternalDatastoreRefused(t *testing.T) {
	l, _ := cluster(t)
	saved, _, err := Save(context.Background(), SaveOptions{DataDir: l.Root, Prefix: "before"})
	if err != nil {
		t.Fatal(err)
	}
	if err := datastore.Write(l, datastore.Config{Endpoint: "postgres://u:pw-secret@127.0.0.1:5432/k"}); err != nil {
		t.Fatal(err)
	}
	err = CheckCluster(l.Root)
	if !errors.Is(err, ErrExternalDatastore) || !strings.Contains(err.Error(), "pg_dump") || strings.Contains(err.Error(), "pw-secret") {
		t.Errorf("CheckCluster: %v", err)
	}
	if _, _, err := Save(context.Background(), SaveOptions{DataDir: l.Root}); !errors.Is(err, ErrExternalDatastore) {
		t.Errorf("Save: %v", err)
	}
	_, err = Restore(context.Background(), RestoreOptions{DataDir: l.Root, Name: saved.Name, Force: true})
	if !errors.Is(err, ErrExternalDatastore) || !strings.Contains(err.Error(), "new --data-dir") {
		t.Errorf("Restore: %v", err)
	}
}
