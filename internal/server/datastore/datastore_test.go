package datastore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/datadir"
)

func TestKindAndRedacted(t *testing.T) {
	for _, c := range []struct {
		endpoint string
		kind     Kind
		redacted string
	}{
		{"", SQLite, "sqlite (embedded)"},
		{"postgres://k3s:s3cret@db.example:5432/k8s?sslmode=disable", Postgres, "postgres://k3s:xxxxx@db.example:5432/k8s?sslmode=disable"},
		{"postgresql://k3s@db.example/k8s?password=s3cret", Postgres, "postgresql://k3s@db.example/k8s?password=xxxxx"},
		{"mysql://k3s:s3cret@tcp(127.0.0.1:3306)/k8s", MySQL, "mysql://k3s:xxxxx@tcp(127.0.0.1:3306)/k8s"},
		{"https://127.0.0.1:2379,https://127.0.0.2:2379", Etcd, "https://127.0.0.1:2379,https://127.0.0.2:2379"},
		{"redis://x:s3cret@h", "", "redis://x:xxxxx@h"},
	} {
		cfg := Config{Endpoint: c.endpoint}
		if k := cfg.Kind(); k != c.kind {
			t.Errorf("%s: kind %q, want %q", c.endpoint, k, c.kind)
		}
		if r := cfg.Redacted(); r != c.redacted || strings.Contains(r, "s3cret") {
			t.Errorf("%s: redacted %q, want %q", c.endpoint, r, c.redacted)
		}
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg       Config
		flag, msg string // "" flag: valid
	}{
		{Config{}, "", ""},
		{Config{Endpoint: "postgres://u:p@127.0.0.1:5432/k"}, "", ""},
		{Config{Endpoint: "postgres:///k?host=/run/postgresql"}, "", ""},
		{Config{Endpoint: "mysql://u:p@tcp(127.0.0.1:3306)/k", CAFile: ca}, "", ""},
		{Config{Endpoint: "https://127.0.0.1:2379"}, "", ""},
		{Config{Endpoint: "127.0.0.1:5432"}, FlagEndpoint, "no scheme"},
		{Config{Endpoint: "redis://h"}, FlagEndpoint, "unknown scheme"},
		{Config{Endpoint: "sqlite:///tmp/x.db"}, FlagEndpoint, "takes no endpoint"},
		{Config{Endpoint: "postgres:///k"}, FlagEndpoint, "names no host"},
		{Config{Endpoint: "mysql://u:p@127.0.0.1:3306/k"}, FlagEndpoint, "not a MySQL data source name"},
		{Config{Endpoint: "https://127.0.0.1:2379/v3"}, FlagEndpoint, "not an etcd client URL"},
		{Config{CAFile: ca}, FlagCAFile, "without an external --datastore-endpoint"},
		{Config{Endpoint: "https://127.0.0.1:2379", CAFile: filepath.Join(dir, "missing")}, FlagCAFile, "cannot be read"},
		{Config{Endpoint: "https://127.0.0.1:2379", CertFile: ca}, FlagCertFile, "without --datastore-keyfile"},
	} {
		errs := c.cfg.Validate()
		if c.flag == "" {
			if len(errs) != 0 {
				t.Errorf("%+v: %v", c.cfg, errs[0])
			}
			continue
		}
		if len(errs) == 0 {
			t.Errorf("%+v: accepted, want an error on --%s", c.cfg, c.flag)
			continue
		}
		if e := errs[0]; e.Flag != c.flag || !strings.Contains(e.Error(), c.msg) || e.Fix == "" {
			t.Errorf("%+v: %q (flag %s), want --%s and %q with a fix", c.cfg, e.Error(), e.Flag, c.flag, c.msg)
		}
	}
	// A password never reaches an error.
	errs := Config{Endpoint: "postgres://u:s3cret@/k"}.Validate()
	if len(errs) == 0 || strings.Contains(errs[0].Error(), "s3cret") {
		t.Errorf("errors %v", errs)
	}
}

func TestIdentityIgnoresCredentials(t *testing.T) {
	same := [][2]string{
		{"postgres://a:1@h:5432/K8S?sslmode=disable", "postgres://b:2@h:5432/k8s"},
		{"postgres://a:1@h:5432", "postgres://a:1@h:5432/kubernetes"},
		{"mysql://a:1@tcp(h:3306)/k", "mysql://b:2@tcp(h:3306)/k?tls=true"},
	}
	for _, p := range same {
		if a, b := (Config{Endpoint: p[0]}).Identity(), (Config{Endpoint: p[1]}).Identity(); a != b {
			t.Errorf("%s and %s: %s != %s", p[0], p[1], a, b)
		}
	}
	if a, b := (Config{Endpoint: "postgres://h/a"}).Identity(), (Config{Endpoint: "postgres://h/b"}).Identity(); a == b {
		t.Errorf("two databases share identity %s", a)
	}
}

func TestRecordRefusesAnotherDatastore(t *testing.T) {
	l := datadir.New(t.TempDir())
	pg := Config{Endpoint: "postgres://u:p@127.0.0.1:5432/k"}
	if err := Match(l, pg); err != nil {
		t.Fatalf("a new data dir refused: %v", err)
	}
	if err := Write(l, pg); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(l.DatastoreFile()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record %v %v, want mode 0600 (it holds the password)", fi, err)
	}
	// Written at every start: the same record is left as it is.
	before, _ := os.Stat(l.DatastoreFile())
	if err := Write(l, pg); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(l.DatastoreFile()); !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("an unchanged record was written again")
	}
	if err := Match(l, Config{Endpoint: "postgres://other:pw@127.0.0.1:5432/k"}); err != nil {
		t.Errorf("the same database with another user refused: %v", err)
	}
	err := Match(l, Config{})
	if err == nil || !strings.Contains(err.Error(), "lives in postgres://u:xxxxx@127.0.0.1:5432/k") {
		t.Errorf("SQLite on a PostgreSQL cluster: %v", err)
	}
	// A data dir from before records: its SQLite file is the record.
	l2 := datadir.New(t.TempDir())
	if err := os.MkdirAll(filepath.Dir(l2.DBFile()), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l2.DBFile(), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err = Match(l2, pg)
	if err == nil || !strings.Contains(err.Error(), "start without --datastore-endpoint") {
		t.Errorf("PostgreSQL on a SQLite cluster: %v", err)
	}
}
