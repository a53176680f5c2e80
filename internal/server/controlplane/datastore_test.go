package controlplane

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
)

// An external PostgreSQL or MySQL database is served to the apiserver by
// kine with its TLS files; etcd is spoken to directly, without kine.
func TestDatastoreWiring(t *testing.T) {
	cfg := Defaults()
	cfg.DataDir = t.TempDir()
	ca := filepath.Join(cfg.DataDir, "db-ca.crt")
	if err := os.WriteFile(ca, []byte("pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Datastore = datastore.Config{Endpoint: "postgres://k:pw@127.0.0.1:5432/k", CAFile: ca}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	certs, err := EnsurePKI(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &Plane{Cfg: &cfg, Certs: certs, Layout: datadir.New(cfg.DataDir)}
	c, err := p.APIServer()
	if err != nil {
		t.Fatal(err)
	}
	cmd := c.Command()
	if cmd.Args[1] != roleconfig.KineFlag+p.Layout.RoleConfig(roleconfig.Kine) || !slices.Contains(cmd.Args, "--etcd-servers=unix://kine.sock") {
		t.Errorf("postgres: apiserver command %v, want kine's config first and its socket", cmd.Args)
	}
	var kc roleconfig.KineConfig
	if err := roleconfig.ReadFile(roleconfig.Kine, p.Layout.RoleConfig(roleconfig.Kine), &kc); err != nil {
		t.Fatal(err)
	}
	if kc.Endpoint != cfg.Datastore.Endpoint || kc.CAFile != ca {
		t.Errorf("kine config %+v", kc)
	}

	cfg.Datastore = datastore.Config{Endpoint: "https://127.0.0.1:2379,https://127.0.0.2:2379", CAFile: ca}
	c, err = p.APIServer()
	if err != nil {
		t.Fatal(err)
	}
	args := c.Command().Args
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, roleconfig.KineFlag) }) ||
		!slices.Contains(args, "--etcd-servers=https://127.0.0.1:2379,https://127.0.0.2:2379") || !slices.Contains(args, "--etcd-cafile="+ca) {
		t.Errorf("etcd: apiserver command %v, want the etcd servers and CA, no kine", args)
	}

	// k3sm's snapshots copy the SQLite file: with an external database the
	// schedule is refused, naming the database's own tool.
	cfg.Ops.SnapshotSchedule = time.Hour
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--snapshot-schedule") || !strings.Contains(err.Error(), "etcdctl snapshot save") {
		t.Errorf("snapshot schedule with etcd: %v", err)
	}
}
