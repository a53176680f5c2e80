// Package snapshot saves, lists, prunes and restores snapshots of a k3sm
// cluster: a consistent copy of kine's SQLite datastore (taken while the
// server runs) bundled with the keys and credentials needed to run it again,
// and a metadata file naming the cluster (its server CA) and the k3sm that
// took it.
//
// A snapshot is a directory <dir>/<name>/ (0700, files 0600):
//
//	metadata.json             Metadata
//	server/db/state.db        the datastore
//	server/tls/, server/cred/ CAs, leaves, service-account key, kubeconfigs, encryption config
//	admin.kubeconfig
//	agent/                    the node's kubeconfigs and tls/
//
// the same relative paths as in the data directory, so a restore copies
// them back. It is written as <name>.<random>.partial and renamed when complete.
package snapshot

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/server/kinedb"
	"github.com/k3sm-dev/k3sm/internal/version"
)

// MetadataFile names the metadata inside a snapshot.
const MetadataFile = "metadata.json"

// DefaultKeep is how many snapshots of one prefix are kept by default.
const DefaultKeep = 5

// Prefixes of the snapshots k3sm takes itself.
const (
	ScheduledPrefix  = "scheduled"
	PreRestorePrefix = "pre-restore"
	DefaultPrefix    = "snapshot"
)

// Metadata describes one snapshot.
type Metadata struct {
	Name    string    `json:"name"`
	Prefix  string    `json:"prefix"`
	Created time.Time `json:"created"`
	// ServerCAFingerprint identifies the cluster: sha256 of its server CA certificate.
	ServerCAFingerprint string `json:"serverCAFingerprint"`
	K3smVersion         string `json:"k3smVersion"`
	K3smCommit          string `json:"k3smCommit"`
	Kubernetes          string `json:"kubernetesVersion"`
	DataDir             string `json:"dataDir"`
	DBBytes             int64  `json:"dbBytes"`
	SecretsEncryption   bool   `json:"secretsEncryption"`
	// Etcd: the cluster's embedded etcd, saved as an etcd snapshot
	// (server/db/etcd-restore.db), not a SQLite file.
	Etcd  bool     `json:"etcd,omitempty"`
	Files []string `json:"files"`
}

// bundled are the paths (relative to the data dir) a snapshot carries
// besides the datastore: everything a restored server needs to be the same
// cluster to its clients and to decrypt its Secrets.
func bundled(l datadir.Layout) []string {
	return []string{l.TLSDir(), l.CredDir(), l.AdminKubeconfig(), l.AgentTLSDir(), l.NodeKubeconfig(), l.LocalPathKubeconfig()}
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`)

// ValidPrefix reports whether p may start a snapshot name.
func ValidPrefix(p string) error {
	if len(p) > 100 || !nameRE.MatchString(p) {
		return fmt.Errorf("%q is not a valid snapshot name: use lower-case letters, digits, '.', '_' and '-'", p)
	}
	return nil
}

// ErrNoCluster is returned when a data dir holds no cluster.
var ErrNoCluster = errors.New("no k3sm cluster")

// ErrExternalDatastore is returned for a cluster whose datastore is an
// external database: its own tools back it up.
var ErrExternalDatastore = errors.New("k3sm snapshots and datastore reads work on the embedded SQLite datastore only")

// CheckCluster returns an error naming what is missing when dataDir holds
// no cluster (no datastore).
func CheckCluster(dataDir string) error {
	l := datadir.New(dataDir)
	if rec, ok, err := datastore.Recorded(l); err != nil {
		return err
	} else if ok && rec.Config.Embedded {
		return nil // the embedded etcd member: saved through etcd's API
	} else if ok && rec.Kind() != datastore.SQLite {
		return fmt.Errorf("%w: the cluster of %s lives in %s (--datastore-endpoint), not in a SQLite file k3sm copies or reads: back it up with %s",
			ErrExternalDatastore, dataDir, rec.Endpoint(), rec.Kind().BackupTool())
	}
	if _, err := os.Stat(l.DBFile()); err != nil {
		return fmt.Errorf("%w at %s (no %s): start `k3sm server --data-dir %s` first, or pass the data dir of an existing cluster with --data-dir or $K3SM_DATA_DIR",
			ErrNoCluster, dataDir, l.DBFile(), dataDir)
	}
	return nil
}

// Fingerprint is the sha256 of the server CA certificate at dataDir, "" when absent.
func Fingerprint(dataDir string) (string, error) {
	return fingerprintFile(datadir.New(dataDir).TLS("server-ca.crt"))
}

func fingerprintFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return "", fmt.Errorf("%s: no PEM certificate", path)
	}
	if _, err := x509.ParseCertificate(block.Bytes); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return fmt.Sprintf("sha256:%x", sha256.Sum256(block.Bytes)), nil
}

// SaveOptions say what Save writes where.
type SaveOptions struct {
	DataDir string
	Dir     string // default <data-dir>/server/snapshots
	Prefix  string // default DefaultPrefix
	Keep    int    // snapshots of Prefix kept, this one included; 0 keeps all
	Now     func() time.Time
}

func (o *SaveOptions) defaults() {
	if o.Dir == "" {
		o.Dir = datadir.New(o.DataDir).SnapshotsDir()
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Save takes a snapshot of the cluster at o.DataDir, running or not, and
// prunes older snapshots of the same prefix down to o.Keep. It returns the
// new snapshot's metadata and the names it pruned.
func Save(ctx context.Context, o SaveOptions) (Metadata, []string, error) {
	o.defaults()
	if err := ValidPrefix(o.Prefix); err != nil {
		return Metadata{}, nil, err
	}
	if err := CheckCluster(o.DataDir); err != nil {
		return Metadata{}, nil, err
	}
	l := datadir.New(o.DataDir)
	now := o.Now().UTC()
	m := Metadata{
		Name: o.Prefix + "-" + now.Format("20060102-150405"), Prefix: o.Prefix, Created: now,
		K3smVersion: version.Version, K3smCommit: version.GitCommit, Kubernetes: version.Kubernetes,
		DataDir: o.DataDir,
	}
	var err error
	if m.ServerCAFingerprint, err = Fingerprint(o.DataDir); err != nil {
		return m, nil, err
	}
	if _, err := os.Stat(l.EncryptionConfig()); err == nil {
		m.SecretsEncryption = true
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return m, nil, fmt.Errorf("snapshot dir: %w", err)
	}
	final := filepath.Join(o.Dir, m.Name)
	for i := 2; exists(final); i++ { // two in one second
		m.Name = fmt.Sprintf("%s-%s-%d", o.Prefix, now.Format("20060102-150405"), i)
		final = filepath.Join(o.Dir, m.Name)
	}
	removeStalePartials(o.Dir, now)
	tmp, err := os.MkdirTemp(o.Dir, m.Name+".*.partial")
	if err != nil {
		return m, nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(tmp)
		}
	}()
	snap := datadir.New(tmp)
	if err := os.MkdirAll(snap.DBDir(), 0o700); err != nil {
		return m, nil, err
	}
	if rec, _, _ := datastore.Recorded(l); rec.Config.Embedded {
		// etcd's own snapshot of the running member, as `etcdctl snapshot
		// save` takes it: restored into a new first server (Restore).
		f, err := os.OpenFile(snap.EtcdRestoreFile(), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return m, nil, err
		}
		m.DBBytes, err = rec.Config.EtcdSnapshot(ctx, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return m, nil, fmt.Errorf("%w (the server must be running: the snapshot is taken from its etcd member)", err)
		}
		m.Etcd = true
		m.Files = append(m.Files, rel(l, l.EtcdRestoreFile()))
	} else {
		db, err := kinedb.Open(l.DBFile())
		if err != nil {
			return m, nil, err
		}
		err = db.CopyTo(ctx, snap.DBFile())
		db.Close()
		if err != nil {
			return m, nil, err
		}
		if err := os.Chmod(snap.DBFile(), 0o600); err != nil {
			return m, nil, err
		}
		st, err := os.Stat(snap.DBFile())
		if err != nil {
			return m, nil, err
		}
		m.DBBytes = st.Size()
		m.Files = append(m.Files, rel(l, l.DBFile()))
	}
	for _, src := range bundled(l) {
		files, err := copyTree(src, filepath.Join(tmp, rel(l, src)))
		if err != nil {
			return m, nil, err
		}
		for _, f := range files {
			m.Files = append(m.Files, rel(snap, f)) // as laid out in the snapshot
		}
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, nil, err
	}
	if err := atomicfile.WriteFile(filepath.Join(tmp, MetadataFile), append(data, '\n'), 0o600); err != nil {
		return m, nil, err
	}
	// Pruned before the new one appears, so a listing never shows more
	// than Keep (a failed rename then leaves one fewer).
	var pruned []string
	if o.Keep > 0 {
		if pruned, err = Prune(o.Dir, o.Prefix, o.Keep-1); err != nil {
			return m, pruned, err
		}
	}
	if err := os.Rename(tmp, final); err != nil { // fails when another save took the name meanwhile
		return m, pruned, fmt.Errorf("snapshot %s: %w", m.Name, err)
	}
	ok = true
	return m, pruned, nil
}

// removeStalePartials removes what saves that died left behind (older than an hour).
func removeStalePartials(dir string, now time.Time) {
	partials, _ := filepath.Glob(filepath.Join(dir, "*.partial"))
	for _, p := range partials {
		if st, err := os.Stat(p); err == nil && now.Sub(st.ModTime()) > time.Hour {
			_ = os.RemoveAll(p)
		}
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func rel(l datadir.Layout, path string) string {
	r, err := filepath.Rel(l.Root, path)
	if err != nil {
		return path
	}
	return r
}

// List returns the snapshots in dir, oldest first. A directory without
// readable metadata is skipped (a .partial one is being written).
func List(dir string) ([]Metadata, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []Metadata
	for _, e := range entries {
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".partial") {
			continue
		}
		m, err := Read(dir, e.Name())
		if err != nil {
			continue
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Metadata) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// Read returns the metadata of the snapshot name in dir.
func Read(dir, name string) (Metadata, error) {
	var m Metadata
	if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." {
		return m, fmt.Errorf("%q is not a snapshot name (see `k3sm snapshot ls`)", name)
	}
	data, err := os.ReadFile(filepath.Join(dir, name, MetadataFile))
	if errors.Is(err, os.ErrNotExist) {
		return m, fmt.Errorf("no snapshot %q in %s (see `k3sm snapshot ls`, or pass --dir)", name, dir)
	} else if err != nil {
		return m, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("snapshot %s: %s: %w", name, MetadataFile, err)
	}
	m.Name = name
	return m, nil
}

// Prune removes the oldest snapshots of prefix in dir until keep are left,
// and returns the names removed.
func Prune(dir, prefix string, keep int) ([]string, error) {
	all, err := List(dir)
	if err != nil {
		return nil, err
	}
	var same []Metadata
	for _, m := range all {
		if m.Prefix == prefix {
			same = append(same, m)
		}
	}
	var removed []string
	for len(same) > keep {
		if err := os.RemoveAll(filepath.Join(dir, same[0].Name)); err != nil {
			return removed, err
		}
		removed = append(removed, same[0].Name)
		same = same[1:]
	}
	return removed, nil
}

// Delete removes one snapshot.
func Delete(dir, name string) error {
	if _, err := Read(dir, name); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(dir, name))
}

// RestoreOptions say which snapshot Restore puts back where.
type RestoreOptions struct {
	DataDir string
	Dir     string
	Name    string
	// Force restores a snapshot of another cluster (another server CA) over this one.
	Force bool
}

// RestoreResult says what Restore did.
type RestoreResult struct {
	Snapshot Metadata
	// PreRestore is the snapshot of the state the restore replaced ("" when
	// the data dir held no cluster).
	PreRestore string
}

// Restore replaces the datastore and credentials of o.DataDir with the
// snapshot's. The server must be stopped: Restore holds the data dir's
// server lock while it works, so no server can start meanwhile. The
// replaced state is saved first as a pre-restore snapshot.
func Restore(ctx context.Context, o RestoreOptions) (RestoreResult, error) {
	var res RestoreResult
	l := datadir.New(o.DataDir)
	if o.Dir == "" {
		o.Dir = l.SnapshotsDir()
	}
	m, err := Read(o.Dir, o.Name)
	if err != nil {
		return res, err
	}
	res.Snapshot = m
	if rec, ok, err := datastore.Recorded(l); err != nil {
		return res, err
	} else if ok && rec.Kind() != datastore.SQLite {
		return res, fmt.Errorf("%w: the cluster of %s lives in %s: restore snapshot %s into a new --data-dir, or restore the database with its own tools",
			ErrExternalDatastore, o.DataDir, rec.Endpoint(), o.Name)
	}
	src := datadir.New(filepath.Join(o.Dir, o.Name))
	if m.Etcd {
		return res, restoreEtcd(o, m, src)
	}
	if _, err := os.Stat(src.DBFile()); err != nil {
		return res, fmt.Errorf("snapshot %s is incomplete: %w", o.Name, err)
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return res, err
	}
	release, err := controlplane.LockDataDir(o.DataDir)
	if err != nil {
		return res, fmt.Errorf("%v (%s): stop it first; a running server's datastore cannot be replaced", err, o.DataDir)
	}
	defer release()
	current, err := Fingerprint(o.DataDir)
	if err != nil {
		return res, err
	}
	if current != "" && m.ServerCAFingerprint != "" && current != m.ServerCAFingerprint && !o.Force {
		return res, fmt.Errorf("snapshot %s is of another cluster (server CA %s) than the one at %s (server CA %s): "+
			"pass --force to replace this cluster with it", o.Name, m.ServerCAFingerprint, o.DataDir, current)
	}
	if CheckCluster(o.DataDir) == nil {
		pre, _, err := Save(ctx, SaveOptions{DataDir: o.DataDir, Prefix: PreRestorePrefix, Keep: DefaultKeep})
		if err != nil {
			return res, fmt.Errorf("saving the current state before the restore: %w", err)
		}
		res.PreRestore = pre.Name
	}
	// The datastore: a checked copy next to it, then the WAL files of the
	// replaced one removed (SQLite would replay them onto the new file) and
	// the copy renamed into place.
	if err := os.MkdirAll(l.DBDir(), 0o700); err != nil {
		return res, err
	}
	tmp := l.DBFile() + ".restore"
	if err := copyFile(src.DBFile(), tmp); err != nil {
		return res, err
	}
	db, err := kinedb.Open(tmp)
	if err == nil {
		err = db.Check(ctx)
		db.Close()
	}
	if err != nil {
		_ = os.Remove(tmp)
		return res, fmt.Errorf("snapshot %s: datastore: %w", o.Name, err)
	}
	for _, f := range l.DBSidecars() {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return res, err
		}
	}
	if err := os.Rename(tmp, l.DBFile()); err != nil {
		return res, err
	}
	for _, dst := range bundled(l) {
		from := filepath.Join(src.Root, rel(l, dst))
		if _, err := os.Stat(from); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := os.RemoveAll(dst); err != nil {
			return res, err
		}
		if _, err := copyTree(from, dst); err != nil {
			return res, err
		}
	}
	return res, nil
}

// restoreEtcd restores an embedded etcd cluster's snapshot onto a new
// first server, as k3s's --cluster-reset does: into a data dir that holds
// no cluster, with the snapshot's credentials and the etcd snapshot placed
// for the next `k3sm server` start, which loads it into a new single
// member. The other servers then join it again in new data dirs.
func restoreEtcd(o RestoreOptions, m Metadata, src datadir.Layout) error {
	l := datadir.New(o.DataDir)
	if _, err := os.Stat(src.EtcdRestoreFile()); err != nil {
		return fmt.Errorf("snapshot %s is incomplete: %w", o.Name, err)
	}
	if _, ok, err := datastore.Recorded(l); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("snapshot %s is of a cluster with embedded etcd: restore it onto a new first server, a --data-dir that holds no cluster (%s holds one); the other servers then join it again with --server and --token in new data dirs", o.Name, o.DataDir)
	}
	if err := os.MkdirAll(l.DBDir(), 0o700); err != nil {
		return err
	}
	release, err := controlplane.LockDataDir(o.DataDir)
	if err != nil {
		return fmt.Errorf("%v (%s): stop it first", err, o.DataDir)
	}
	defer release()
	if _, err := datastore.EtcdSnapshotKeys(src.EtcdRestoreFile()); err != nil {
		return fmt.Errorf("snapshot %s: %w", o.Name, err)
	}
	if err := copyFile(src.EtcdRestoreFile(), l.EtcdRestoreFile()); err != nil {
		return err
	}
	for _, dst := range bundled(l) {
		from := filepath.Join(src.Root, rel(l, dst))
		if _, err := os.Stat(from); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if _, err := copyTree(from, dst); err != nil {
			return err
		}
	}
	// The data dir's cluster lives in its own etcd member from now on.
	cfg := controlplane.Defaults()
	cfg.DataDir, cfg.ClusterInit = o.DataDir, true
	if err := cfg.Validate(); err != nil {
		return err
	}
	return datastore.Write(l, cfg.Datastore)
}

// copyTree copies src (a file or a directory) to dst with 0600 files and
// 0700 directories, and returns the files it wrote. A missing src copies
// nothing.
func copyTree(src, dst string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && path == src {
				return fs.SkipAll
			}
			return err
		}
		r, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, r)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o700)
		case d.Type().IsRegular():
			if err := copyFile(path, target); err != nil {
				return err
			}
			out = append(out, target)
		}
		return nil
	})
	return out, err
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Schedule saves a snapshot every `every` until ctx ends, keeping the
// newest `keep` scheduled ones. Failures are logged and retried at the next tick.
func Schedule(ctx context.Context, dataDir, dir string, every time.Duration, keep int, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m, pruned, err := Save(ctx, SaveOptions{DataDir: dataDir, Dir: dir, Prefix: ScheduledPrefix, Keep: keep})
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("scheduled snapshot failed (retried at the next one)", "err", err)
			}
			continue
		}
		log.Info("snapshot saved", "name", m.Name, "dir", dir, "pruned", pruned)
	}
}
