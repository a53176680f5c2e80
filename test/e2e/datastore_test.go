package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/server/doctor"
	"github.com/k3sm-dev/k3sm/internal/server/status"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// dbPassword is every test database's password: it must never show in
// k3sm's output, status or doctor.
const dbPassword = "Dat4st0re-s3cret"

// database is one engine a test started on 127.0.0.1 of its network
// namespace.
type database struct {
	endpoint string
	flags    []string // --datastore-cafile and friends
	proc     *exec.Cmd
	done     chan error
}

// kill ends the database at once, as a crash would.
func (d *database) kill(t *testing.T) {
	_ = d.proc.Process.Signal(syscall.SIGKILL)
	<-d.done
}

// startDaemon runs a database's server process until the test ends.
func startDaemon(t *testing.T, cmd *exec.Cmd, logPath string) *database {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", cmd.Path, err)
	}
	d := &database{proc: cmd, done: make(chan error, 1)}
	go func() { d.done <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.done:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-d.done
			}
		}
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("%s's log:\n%s", filepath.Base(cmd.Path), out)
		}
	})
	return d
}

// waitTCP waits until something accepts connections on 127.0.0.1:port.
func waitTCP(t *testing.T, d *database, port int, what string) {
	t.Helper()
	poll.UntilNil(t, time.Minute, what+" listening on port "+strconv.Itoa(port), func() error {
		select {
		case err := <-d.done:
			d.done <- err
			t.Fatalf("%s exited before it listened: %v", what, err)
		default:
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// need returns the path of a database's program, failing with how to
// install it.
func need(t *testing.T, path, pkg string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s is missing: apt-get install %s (.ci/run installs it)", path, pkg)
	}
	return path
}

// startPostgres runs Debian's PostgreSQL (initdb + postgres, as the
// postgres account when root: it refuses to run as root) with a password
// for user k3sm; kine creates the database.
func startPostgres(t *testing.T) *database {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		t.Fatal("no /usr/lib/postgresql/*/bin/postgres: apt-get install postgresql (.ci/run installs it)")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	dir, err := os.MkdirTemp("", "k3sm-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var attr *syscall.SysProcAttr
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("PostgreSQL refuses to run as root and there is no postgres account: %v (apt-get install postgresql makes it)", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		attr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte(dbPassword+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if attr != nil {
		_ = os.Chown(pw, int(attr.Credential.Uid), int(attr.Credential.Gid))
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "k3sm", "--pwfile", pw,
		"--auth-host=scram-sha-256", "--auth-local=trust", "--no-sync")
	initdb.SysProcAttr, initdb.Dir = attr, dir
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	port := freePort(t)
	// fsync off: a test's database, not a benchmark's.
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"), "-k", dir, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "max_connections=200")
	cmd.SysProcAttr, cmd.Dir = attr, dir
	d := startDaemon(t, cmd, filepath.Join(dir, "postgres.log"))
	waitTCP(t, d, port, "postgres")
	d.endpoint = fmt.Sprintf("postgres://k3sm:%s@127.0.0.1:%d/k3sm?sslmode=disable", dbPassword, port)
	return d
}

// startMariaDB runs Debian's MariaDB with a user k3sm that has a password.
func startMariaDB(t *testing.T) *database {
	mariadbd := need(t, "/usr/sbin/mariadbd", "mariadb-server")
	installDB := need(t, "/usr/bin/mariadb-install-db", "mariadb-server")
	client := need(t, "/usr/bin/mariadb", "mariadb-client")
	dir := t.TempDir()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "mysqld.sock")
	if out, err := exec.Command(installDB, "--no-defaults", "--datadir="+data, "--user="+u.Username,
		"--auth-root-authentication-method=socket", "--skip-test-db").CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	port := freePort(t)
	cmd := exec.Command(mariadbd, "--no-defaults", "--datadir="+data, "--user="+u.Username, "--socket="+sock,
		"--port="+strconv.Itoa(port), "--bind-address=127.0.0.1", "--pid-file="+filepath.Join(dir, "mysqld.pid"),
		"--innodb-flush-log-at-trx-commit=0", "--skip-log-bin")
	d := startDaemon(t, cmd, filepath.Join(dir, "mariadb.log"))
	waitTCP(t, d, port, "mariadbd")
	sql := fmt.Sprintf("CREATE USER 'k3sm'@'%%' IDENTIFIED BY '%s'; GRANT ALL ON *.* TO 'k3sm'@'%%';", dbPassword)
	if out, err := exec.Command(client, "--no-defaults", "--socket="+sock, "-u", "root", "-e", sql).CombinedOutput(); err != nil {
		t.Fatalf("creating the k3sm user: %v\n%s", err, out)
	}
	d.endpoint = fmt.Sprintf("mysql://k3sm:%s@tcp(127.0.0.1:%d)/k3sm", dbPassword, port)
	return d
}

// startEtcd runs etcd's own server (built from go.mod's version, as the
// klimax node image's) with client-certificate TLS: the apiserver speaks
// to it through --datastore-cafile/certfile/keyfile.
func startEtcd(t *testing.T) *database {
	dir := t.TempDir()
	bin := filepath.Join(dir, "etcd")
	build := exec.Command("go", "build", "-o", bin, "../../internal/klimax/nodeimage/cmd/etcd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building etcd: %v\n%s", err, out)
	}
	tlsDir := filepath.Join(dir, "tls")
	ca, err := pki.LoadOrCreateCA(tlsDir, "etcd-ca", "etcd-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Ensure(tlsDir, "server", pki.LeafSpec{CommonName: "etcd", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.Ensure(tlsDir, "client", pki.LeafSpec{CommonName: "k3sm", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	port, peer := freePort(t), freePort(t)
	client := fmt.Sprintf("https://127.0.0.1:%d", port)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	cmd := exec.Command(bin, "--name=e2e", "--data-dir="+filepath.Join(dir, "data"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL, "--initial-cluster=e2e="+peerURL,
		"--cert-file="+srv.CertPath, "--key-file="+srv.KeyPath, "--trusted-ca-file="+ca.CertPath, "--client-cert-auth",
		"--unsafe-no-fsync")
	d := startDaemon(t, cmd, filepath.Join(dir, "etcd.log"))
	waitTCP(t, d, port, "etcd")
	d.endpoint = client
	d.flags = []string{"--datastore-cafile=" + ca.CertPath, "--datastore-certfile=" + cli.CertPath, "--datastore-keyfile=" + cli.KeyPath}
	return d
}

// TestExternalDatastore: the control plane on each engine users run, started
// here: the API's core works, nothing lands in SQLite, a restart finds the
// cluster, the password shows nowhere, and a database that stops answering
// shows in status and doctor.
func TestExternalDatastore(t *testing.T) {
	for _, engine := range []struct {
		name  string
		start func(*testing.T) *database
		shown string // how status shows the endpoint
	}{
		{"PostgreSQL", startPostgres, "postgres://k3sm:xxxxx@127.0.0.1:"},
		{"MariaDB", startMariaDB, "mysql://k3sm:xxxxx@tcp(127.0.0.1:"},
		{"etcd", startEtcd, "https://127.0.0.1:"},
	} {
		t.Run(engine.name, func(t *testing.T) {
			db := engine.start(t)
			s := newServer(t, append([]string{"--datastore-endpoint=" + db.endpoint}, db.flags...)...)
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
			db.kill(t)
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
