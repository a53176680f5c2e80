package datastore

import (
	"bytes"
	"context"
	"database/sql"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/k3sm-dev/k3sm/internal/testutil/dbtest"
)

// TestBootstrapStoreIntegration runs the servers' bootstrap records on each
// engine, as Bootstrap opens them: PostgreSQL and MariaDB (Debian's, as CI
// installs them) and etcd (built from go.mod's version).
func TestBootstrapStoreIntegration(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts PostgreSQL, MariaDB and etcd")
	}
	for _, engine := range []struct {
		name  string
		start func(t *testing.T) *dbtest.DB
		// create makes the endpoint's database, as kine does on its
		// first start (nil: etcd has none).
		create func(t *testing.T, db *dbtest.DB)
	}{
		{"PostgreSQL", func(t *testing.T) *dbtest.DB {
			if bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres"); len(bins) == 0 {
				t.Skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run installs it)")
			}
			return startDB(t, dbtest.Postgres, false)
		}, createPostgres},
		{"MariaDB", func(t *testing.T) *dbtest.DB {
			if _, err := os.Stat("/usr/sbin/mariadbd"); err != nil {
				t.Skip("MariaDB is not installed (apt-get install mariadb-server mariadb-client; .ci/run installs it)")
			}
			return startDB(t, dbtest.MariaDB, false)
		}, createMySQL},
		{"etcd", func(t *testing.T) *dbtest.DB {
			bin, err := dbtest.BuildEtcd("../../..", t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return startDB(t, func(o dbtest.Options) (*dbtest.DB, error) { return dbtest.Etcd(bin, o) }, true)
		}, nil},
	} {
		t.Run(engine.name, func(t *testing.T) {
			t.Parallel()
			db := engine.start(t)
			cfg := configOf(t, db)
			if errs := cfg.Validate(); len(errs) != 0 {
				t.Fatalf("the test's datastore flags: %v", errs[0])
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			if engine.create != nil {
				// Before kine ran the database does not exist: a joining
				// server's Get finds no record or says why, without the
				// password.
				s, err := cfg.Bootstrap()
				if err != nil {
					t.Fatalf("Bootstrap: %v", err)
				}
				_, ok, err := s.Get(ctx, "abcdef")
				if ok || (err != nil && strings.Contains(err.Error(), dbtest.Password)) {
					t.Errorf("Get before the database exists: ok %v, %v", ok, err)
				}
				t.Logf("Get before the database exists: ok=%v err=%v", ok, err)
				s.Close()
				engine.create(t, db)
			}

			s, err := cfg.Bootstrap()
			if err != nil {
				t.Fatalf("Bootstrap: %v", err)
			}
			// Before any record (no table yet for SQL).
			if v, ok, err := s.Get(ctx, "abcdef"); ok || err != nil || v != nil {
				t.Errorf("Get of a missing id on a new database: %q, %v, %v", v, ok, err)
			}
			if ids, err := s.List(ctx); err != nil || len(ids) != 0 {
				t.Errorf("List on a new database: %v, %v", ids, err)
			}
			if err := s.Delete(ctx, "abcdef"); err != nil {
				t.Errorf("Delete on a new database: %v", err)
			}

			value := func(seed uint64, n int) []byte {
				r := rand.New(rand.NewPCG(seed, seed))
				v := make([]byte, n)
				for i := range v {
					v[i] = byte(r.Uint32())
				}
				// Every byte value, 0x00 and 0xff first.
				copy(v, []byte{0x00, 0xff, 0x00, 0x00, 0xfe, '\'', '"', '\\', '\n'})
				for i := 0; i < 256 && 16+i < n; i++ {
					v[16+i] = byte(i)
				}
				return v
			}
			recs := map[string][]byte{"zzzzzz": value(1, 64<<10), "abcdef": value(2, 64<<10+7), "m0m0m0": value(3, 300)}
			for _, id := range []string{"zzzzzz", "abcdef", "m0m0m0"} {
				if err := s.Put(ctx, id, recs[id]); err != nil {
					t.Fatalf("Put %s: %v", id, err)
				}
			}
			check := func(when string) {
				t.Helper()
				for id, want := range recs {
					got, ok, err := s.Get(ctx, id)
					if err != nil || !ok || !bytes.Equal(got, want) {
						t.Errorf("%s: Get %s: %d bytes, ok %v, %v; want %d bytes alike", when, id, len(got), ok, err, len(want))
					}
				}
				ids, err := s.List(ctx)
				want := make([]string, 0, len(recs))
				for id := range recs {
					want = append(want, id)
				}
				slices.Sort(want)
				if err != nil || !slices.Equal(ids, want) {
					t.Errorf("%s: List %v, %v; want %v", when, ids, err, want)
				}
			}
			check("after Put")
			if _, ok, err := s.Get(ctx, "abcdeg"); ok || err != nil {
				t.Errorf("Get of a missing id: ok %v, %v", ok, err)
			}

			// Overwritten, shorter and longer.
			recs["abcdef"] = value(4, 10)
			recs["zzzzzz"] = value(5, 200<<10)
			for _, id := range []string{"abcdef", "zzzzzz"} {
				if err := s.Put(ctx, id, recs[id]); err != nil {
					t.Fatalf("Put %s again: %v", id, err)
				}
			}
			check("after overwriting")

			// Every server syncs: several write the same record at once.
			other, err := cfg.Bootstrap()
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				st := s
				if i%2 == 1 {
					st = other
				}
				wg.Go(func() { errs[i] = st.Put(ctx, "m0m0m0", recs["m0m0m0"]) })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Errorf("concurrent Put: %v", err)
				}
			}
			other.Close()
			check("after concurrent Puts")

			if err := s.Delete(ctx, "abcdef"); err != nil {
				t.Errorf("Delete: %v", err)
			}
			delete(recs, "abcdef")
			if _, ok, err := s.Get(ctx, "abcdef"); ok || err != nil {
				t.Errorf("Get after Delete: ok %v, %v", ok, err)
			}
			if err := s.Delete(ctx, "abcdef"); err != nil {
				t.Errorf("Delete of a missing id: %v", err)
			}
			check("after Delete")

			if es, ok := s.(etcdStore); ok {
				// Keys beside the prefix are not records.
				for _, k := range []string{"/k3sm/bootstrap", "/k3sm/bootstrapx", "/registry/namespaces/default"} {
					if _, err := es.cli.Put(ctx, k, "x"); err != nil {
						t.Fatal(err)
					}
				}
				check("beside other keys")
			}

			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if _, _, err := s.Get(ctx, "zzzzzz"); err == nil {
				t.Errorf("Get after Close succeeded")
			}
		})
	}
}

// configOf is the Config the server builds of --datastore-endpoint and the
// TLS flags.
func configOf(t *testing.T, db *dbtest.DB) Config {
	t.Helper()
	c := Config{Endpoint: db.Endpoint}
	for _, f := range db.Flags {
		name, v, ok := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		switch {
		case ok && name == FlagCAFile:
			c.CAFile = v
		case ok && name == FlagCertFile:
			c.CertFile = v
		case ok && name == FlagKeyFile:
			c.KeyFile = v
		default:
			t.Fatalf("unknown datastore flag %q", f)
		}
	}
	return c
}

// createPostgres makes the endpoint's database, as kine does.
func createPostgres(t *testing.T, db *dbtest.DB) {
	t.Helper()
	u, err := Config{Endpoint: db.Endpoint}.pgURL()
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	u.Path = "/postgres"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgconn.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE DATABASE "`+name+`"`).ReadAll(); err != nil {
		t.Fatal(err)
	}
}

// createMySQL makes the endpoint's database, as kine does.
func createMySQL(t *testing.T, db *dbtest.DB) {
	t.Helper()
	_, dsn, _ := strings.Cut(db.Endpoint, "://")
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := cfg.DBName
	cfg.DBName = ""
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := sql.OpenDB(conn)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatal(err)
	}
}

// startDB starts one engine on 127.0.0.1 for the test.
func startDB(t *testing.T, start func(o dbtest.Options) (*dbtest.DB, error), peer bool) *dbtest.DB {
	t.Helper()
	return dbtest.ForTest(t, start, peer)
}
