package kinedb

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
)

func fixture(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, created INTEGER, deleted INTEGER,
			create_revision INTEGER, prev_revision INTEGER, lease INTEGER, value BLOB, old_value BLOB)`,
		`INSERT INTO kine (name, deleted, value) VALUES ('/registry/secrets/a/one', 0, 'v1')`,
		`INSERT INTO kine (name, deleted, value) VALUES ('/registry/secrets/a/one', 0, 'v2')`,
		`INSERT INTO kine (name, deleted, value) VALUES ('/registry/secrets/a/gone', 0, 'x')`,
		`INSERT INTO kine (name, deleted, value) VALUES ('/registry/secrets/a/gone', 1, 'x')`,
		`INSERT INTO kine (name, deleted, value) VALUES ('/registry/secretsx/a/other', 0, 'y')`,
		`INSERT INTO kine (name, deleted, value) VALUES ('/registry/configmaps/a/c', 0, 'z')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(q, err)
		}
	}
	return path
}

func TestLatestAndCopy(t *testing.T) {
	d, err := Open(fixture(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	got := map[string]string{}
	if err := d.Latest(ctx, "/registry/secrets/", func(k string, v []byte) error { got[k] = string(v); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["/registry/secrets/a/one"] != "v2" {
		t.Fatalf("latest = %v, want only one=v2", got)
	}
	if _, ok, err := d.Value(ctx, "/registry/secrets/a/gone"); ok || err != nil {
		t.Fatalf("deleted key: ok=%v err=%v", ok, err)
	}
	dst := filepath.Join(t.TempDir(), "copy.db")
	if err := d.CopyTo(ctx, dst); err != nil {
		t.Fatal(err)
	}
	c, err := Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := c.Value(ctx, "/registry/configmaps/a/c"); !ok || err != nil || string(v) != "z" {
		t.Fatalf("copy: %q %v %v", v, ok, err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.db")); err == nil {
		t.Fatal("opening a missing datastore must fail, not create it")
	}
}
