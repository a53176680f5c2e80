package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/k3sm-dev/k3sm/internal/server/doctor"
	"github.com/k3sm-dev/k3sm/internal/server/status"
	"github.com/k3sm-dev/k3sm/internal/testutil/dbtest"
)

// dbPassword is every test database's password: it must never show in
// k3sm's output, status or doctor.
const dbPassword = dbtest.Password

// database starts one engine on 127.0.0.1 of the test's namespace, stopped
// (and its log shown on failure) when the test ends.
func database(t *testing.T, start func(o dbtest.Options) (*dbtest.DB, error), peer bool) *dbtest.DB {
	t.Helper()
	return dbtest.ForTest(t, start, peer)
}

func startPostgres(t *testing.T) *dbtest.DB { return database(t, dbtest.Postgres, false) }
func startMariaDB(t *testing.T) *dbtest.DB  { return database(t, dbtest.MariaDB, false) }

// startEtcd runs etcd's own server (built from go.mod's version, as the
// klimax node image's) with client-certificate TLS: the apiserver speaks
// to it through --datastore-cafile/certfile/keyfile.
func startEtcd(t *testing.T) *dbtest.DB {
	bin, err := dbtest.BuildEtcd("../..", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return database(t, func(o dbtest.Options) (*dbtest.DB, error) { return dbtest.Etcd(bin, o) }, true)
}

// TestExternalDatastore: the control plane on each engine users run, started
// here: the API's core works, nothing lands in SQLite, a restart finds the
// cluster, the password shows nowhere, and a database that stops answering
// shows in status and doctor.
func TestExternalDatastore(t *testing.T) {
	// Only the control plane is under test: its servers run no node
	// (--disable-agent), so nothing of theirs is shared with the other
	// tests' servers but loopback ports from one registry, and it runs
	// beside the other parallel tests.
	t.Parallel()
	for _, engine := range []struct {
		name  string
		start func(*testing.T) *dbtest.DB
		shown string // how status shows the endpoint
	}{
		{"PostgreSQL", startPostgres, "postgres://k3sm:xxxxx@127.0.0.1:"},
		{"MariaDB", startMariaDB, "mysql://k3sm:xxxxx@tcp(127.0.0.1:"},
		{"etcd", startEtcd, "https://127.0.0.1:"},
	} {
		t.Run(engine.name, func(t *testing.T) {
			db := engine.start(t)
			s := newServer(t, append([]string{"--datastore-endpoint=" + db.Endpoint, "--disable-agent"}, db.Flags...)...)
			s.start()
			coreCRUDAndWatch(t, s)
			crdAndCustomObject(t, s)
			serverSideApplyConflict(t, s)
			if _, err := os.Stat(filepath.Join(s.dataDir, "server", "db", "state.db")); err == nil {
				t.Errorf("a SQLite file was made beside the external datastore")
			}

			r, _ := statusJSON(t, s.dataDir)
			if c := component(r, "datastore"); c.Health != status.OK || !strings.Contains(c.Detail, engine.shown) {
				t.Errorf("status: datastore %+v, want ok and %q", c, engine.shown)
			}
			kine := component(r, "kine")
			if engine.name == "etcd" && kine.Health != status.Off {
				t.Errorf("status: kine %+v with etcd, want off", kine)
			}
			if engine.name != "etcd" && (kine.Health != status.OK || !strings.Contains(kine.Detail, engine.shown)) {
				t.Errorf("status: kine %+v, want ok serving %q", kine, engine.shown)
			}

			s.stop()
			// The data dir's cluster is this database's: started on the
			// embedded SQLite instead it is refused before anything runs.
			s2 := *s
			s2.extra = nil
			out, err := k3sm(t, time.Minute, s2.args()...)
			if err == nil || !strings.Contains(out, "--datastore-endpoint") || !strings.Contains(out, "lives in "+engine.shown) {
				t.Errorf("the same data dir on SQLite: %v\n%s", err, out)
			}
			// A server of another data dir on the same database would serve
			// this cluster with certificates of its own: refused.
			other := newServer(t, s.extra...)
			out, err = k3sm(t, time.Minute, other.args()...)
			if err == nil || !strings.Contains(out, "already holds a cluster") {
				t.Errorf("a second data dir on the same database: %v\n%s", err, out)
			}
			// The cluster lives in the database: a restart finds it.
			s.start()
			if _, err := s.client().CoreV1().ConfigMaps("default").Get(ctx(t), "ssa", metav1.GetOptions{}); err != nil {
				t.Errorf("after a restart: %v", err)
			}

			// A database that stops answering is not healthy.
			db.Kill()
			r, code := statusJSON(t, s.dataDir)
			if c := component(r, "datastore"); c.Health != status.Unhealthy || !strings.Contains(c.Detail, "does not answer") || code == 0 {
				t.Errorf("status with the database down (exit %d): datastore %+v", code, c)
			}
			dout, _ := runExit(t, "doctor", "--data-dir", s.dataDir, "-o", "json")
			var dr doctor.Report
			if err := json.Unmarshal([]byte(dout), &dr); err != nil {
				t.Fatalf("doctor -o json: %v\n%s", err, dout)
			}
			found := false
			for _, c := range dr.Checks {
				if c.Name == "datastore" {
					found = true
					if c.Status != doctor.Fail || !strings.Contains(c.Fix, "--datastore-endpoint") {
						t.Errorf("doctor with the database down: %+v", c)
					}
				}
			}
			if !found {
				t.Errorf("doctor has no datastore check: %s", dout)
			}
			sout, _ := runExit(t, "status", "--data-dir", s.dataDir)
			for what, text := range map[string]string{"the server's output": s.output(), "status": sout, "doctor": dout} {
				if strings.Contains(text, dbPassword) {
					t.Errorf("%s shows the database's password", what)
				}
			}
		})
	}
}

// TestDatastoreBadInput: a bad endpoint is refused at once naming the flag,
// and a database that does not answer is refused after a short wait,
// before anything starts and without the password.
func TestDatastoreBadInput(t *testing.T) {
	base := func(dir string) []string {
		return []string{"server", "--data-dir", dir, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
			"--https-listen-port", fmt.Sprint(freePort(t)), "--scheduler-port", fmt.Sprint(freePort(t)), "--controller-manager-port", fmt.Sprint(freePort(t))}
	}
	for _, c := range []struct {
		name, endpoint, want string
	}{
		{"unknown scheme", "redis://127.0.0.1:6379", "unknown scheme"},
		{"not a URL", "127.0.0.1:5432", "not a URL"},
		{"MySQL without tcp()", "mysql://k3sm:" + dbPassword + "@127.0.0.1:3306/k3sm", "not a MySQL data source name"},
		{"nothing listens", fmt.Sprintf("postgres://k3sm:%s@127.0.0.1:%d/k3sm", dbPassword, freePort(t)), "the database does not answer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			start := time.Now()
			out, err := k3sm(t, time.Minute, append(base(dir), "--datastore-endpoint="+c.endpoint)...)
			if err == nil || !strings.Contains(out, "--datastore-endpoint") || !strings.Contains(out, c.want) {
				t.Fatalf("want an error naming --datastore-endpoint and %q, got %v:\n%s", c.want, err, out)
			}
			if strings.Contains(out, dbPassword) {
				t.Errorf("the error shows the password:\n%s", out)
			}
			if _, err := os.Stat(filepath.Join(dir, "server", "tls", "server-ca.crt")); err == nil {
				t.Errorf("a cluster was made (%s) before the datastore was checked", time.Since(start))
			}
		})
	}
}
