// Package dbtest starts the real databases k3sm's --datastore-endpoint
// takes, for tests and benchmarks: Debian's PostgreSQL and MariaDB, and etcd
// built from go.mod's version, each on a 127.0.0.1 port of the caller's
// choosing with its files in a directory of the caller's, and stops them.
// Durability settings are relaxed where a test does not need them (fsync
// off); a benchmark says so beside its figures.
package dbtest

import (
	"errors"
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

	"github.com/k3sm-dev/k3sm/internal/testutil/ports"

	"github.com/k3sm-dev/k3sm/internal/pki"
)

// Password is every database's password for user k3sm: callers check that
// it never shows in k3sm's output.
const Password = "Dat4st0re-s3cret"

// DB is one running database.
type DB struct {
	// Endpoint is the --datastore-endpoint value (with Password).
	Endpoint string
	// Flags are the other datastore flags it needs (TLS files).
	Flags   []string
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan error
}

// exited reports whether the process has ended (its Wait returned).
func (d *DB) exited() bool {
	select {
	case err := <-d.done:
		d.done <- err
		return true
	default:
		return false
	}
}

// Kill ends the database at once, as a crash would.
func (d *DB) Kill() {
	if !d.exited() {
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		err := <-d.done
		d.done <- err
	}
}

// Stop asks the database to stop and waits up to 20 s before killing it.
func (d *DB) Stop() {
	if d.exited() {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		d.done <- err
	case <-time.After(20 * time.Second):
		d.Kill()
	}
}

// Log is what the database printed.
func (d *DB) Log() string {
	b, _ := os.ReadFile(d.LogPath)
	return string(b)
}

func start(name string, cmd *exec.Cmd, dir string, port int) (*DB, error) {
	return startAt(name, cmd, dir, "127.0.0.1", port)
}

func startAt(name string, cmd *exec.Cmd, dir, host string, port int) (*DB, error) {
	d := &DB{Name: name, LogPath: filepath.Join(dir, name+".log"), cmd: cmd, done: make(chan error, 1)}
	logf, err := os.Create(d.LogPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("%s: %w", cmd.Path, err)
	}
	go func() { d.done <- cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case err := <-d.done:
			d.done <- err
			return nil, fmt.Errorf("%s exited before it listened (%v):\n%s", name, err, d.Log())
		default:
		}
		c, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), time.Second)
		if err == nil {
			c.Close()
			return d, nil
		}
		if time.Now().After(deadline) {
			d.Kill()
			return nil, fmt.Errorf("%s not listening on port %d after 1m:\n%s", name, port, d.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func need(path, pkg string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("%s is missing: apt-get install %s (.ci/run installs it)", path, pkg)
	}
	return nil
}

// Options say where a database keeps its files and listens.
type Options struct {
	// Dir holds its data and log (made if missing).
	Dir string
	// Port is its 127.0.0.1 port; PeerPort is etcd's peer port.
	Port, PeerPort int
	// Host, for PostgreSQL only, is the address it listens on instead of
	// 127.0.0.1: one on a bridge the test made, for servers in network
	// namespaces of their own (clients on that bridge's subnet may log in).
	Host string
	// Durable keeps fsync on (a benchmark of the engines as users run them).
	Durable bool
}

// Postgres runs Debian's PostgreSQL (initdb and postgres, as the postgres
// account when root: it refuses root) with a password for user k3sm; kine
// creates the database. As root, o.Dir's parents must let that account
// through (os.MkdirTemp's 0700 does not).
func Postgres(o Options) (*DB, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		return nil, errors.New("no /usr/lib/postgresql/*/bin/postgres: apt-get install postgresql (.ci/run installs it)")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	var attr *syscall.SysProcAttr
	chown := func(string) error { return nil }
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL refuses to run as root and there is no postgres account: %v (apt-get install postgresql makes it)", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		attr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		chown = func(p string) error { return os.Chown(p, uid, gid) }
	}
	pw := filepath.Join(o.Dir, "pw")
	if err := os.WriteFile(pw, []byte(Password+"\n"), 0o600); err != nil {
		return nil, err
	}
	for _, p := range []string{o.Dir, pw} {
		if err := chown(p); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(o.Dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "k3sm", "--pwfile", pw,
		"--auth-host=scram-sha-256", "--auth-local=trust", "--no-sync")
	initdb.SysProcAttr, initdb.Dir = attr, o.Dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	host := "127.0.0.1"
	if o.Host != "" {
		host = o.Host
		hba, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return nil, err
		}
		_, err = hba.WriteString("host all all samenet scram-sha-256\n")
		hba.Close()
		if err != nil {
			return nil, err
		}
	}
	args := []string{"-D", data, "-k", o.Dir, "-p", strconv.Itoa(o.Port),
		"-c", "listen_addresses=" + host, "-c", "max_connections=200"}
	if !o.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off")
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.SysProcAttr, cmd.Dir = attr, o.Dir
	d, err := startAt("postgres", cmd, o.Dir, host, o.Port)
	if err != nil {
		return nil, err
	}
	d.Endpoint = fmt.Sprintf("postgres://k3sm:%s@%s/k3sm?sslmode=disable", Password, net.JoinHostPort(host, strconv.Itoa(o.Port)))
	return d, nil
}

// MariaDB runs Debian's MariaDB with a user k3sm that has a password.
func MariaDB(o Options) (*DB, error) {
	const mariadbd, installDB, client = "/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db", "/usr/bin/mariadb"
	for _, p := range [][2]string{{mariadbd, "mariadb-server"}, {installDB, "mariadb-server"}, {client, "mariadb-client"}} {
		if err := need(p[0], p[1]); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	u, err := user.Current()
	if err != nil {
		return nil, err
	}
	data, sock := filepath.Join(o.Dir, "data"), filepath.Join(o.Dir, "mysqld.sock")
	if out, err := exec.Command(installDB, "--no-defaults", "--datadir="+data, "--user="+u.Username,
		"--auth-root-authentication-method=socket", "--skip-test-db").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mariadb-install-db: %v\n%s", err, out)
	}
	flush := "1"
	if !o.Durable {
		flush = "0"
	}
	cmd := exec.Command(mariadbd, "--no-defaults", "--datadir="+data, "--user="+u.Username, "--socket="+sock,
		"--port="+strconv.Itoa(o.Port), "--bind-address=127.0.0.1", "--pid-file="+filepath.Join(o.Dir, "mysqld.pid"),
		"--innodb-flush-log-at-trx-commit="+flush, "--skip-log-bin", "--max-connections=300")
	d, err := start("mariadbd", cmd, o.Dir, o.Port)
	if err != nil {
		return nil, err
	}
	sql := fmt.Sprintf("CREATE USER 'k3sm'@'%%' IDENTIFIED BY '%s'; GRANT ALL ON *.* TO 'k3sm'@'%%';", Password)
	if out, err := exec.Command(client, "--no-defaults", "--socket="+sock, "-u", "root", "-e", sql).CombinedOutput(); err != nil {
		d.Kill()
		return nil, fmt.Errorf("creating the k3sm user: %v\n%s", err, out)
	}
	d.Endpoint = fmt.Sprintf("mysql://k3sm:%s@tcp(127.0.0.1:%d)/k3sm", Password, o.Port)
	return d, nil
}

// BuildEtcd builds etcd's own server main at go.mod's version (the klimax
// node image's, internal/klimax/nodeimage/cmd/etcd) and returns its path:
// in the user's cache dir, by version, or in dir when that cannot be
// used; moduleRoot is this module's directory.
func BuildEtcd(moduleRoot, dir string) (string, error) {
	// Cached by etcd's version outside the clone, as the node image is:
	// each machine builds it once.
	ver, err := exec.Command("go", "list", "-C", moduleRoot, "-m", "-f", "{{.Version}}", "go.etcd.io/etcd/server/v3").Output()
	if err == nil {
		if cache, err := os.UserCacheDir(); err == nil {
			bin := filepath.Join(cache, "k3sm-test", "etcd-"+strings.TrimSpace(string(ver)), "etcd")
			if _, err := os.Stat(bin); err == nil {
				return bin, nil
			}
			if err := buildEtcd(moduleRoot, bin); err == nil {
				return bin, nil
			}
		}
	}
	bin := filepath.Join(dir, "etcd")
	return bin, buildEtcd(moduleRoot, bin)
}

func buildEtcd(moduleRoot, bin string) error {
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return err
	}
	// Built beside its final name and renamed: a build stopped half-way
	// never leaves a binary that looks cached.
	tmp := bin + ".tmp"
	build := exec.Command("go", "build", "-o", tmp, "./internal/klimax/nodeimage/cmd/etcd")
	build.Dir = moduleRoot
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building etcd: %v\n%s", err, out)
	}
	return os.Rename(tmp, bin)
}

// Etcd runs the etcd at bin as one member with client-certificate TLS; the
// apiserver reaches it through Flags (--datastore-cafile/certfile/keyfile).
func Etcd(bin string, o Options) (*DB, error) {
	tlsDir := filepath.Join(o.Dir, "tls")
	ca, err := pki.LoadOrCreateCA(tlsDir, "etcd-ca", "etcd-test-ca")
	if err != nil {
		return nil, err
	}
	srv, err := ca.Ensure(tlsDir, "server", pki.LeafSpec{CommonName: "etcd", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true, Client: true})
	if err != nil {
		return nil, err
	}
	cli, err := ca.Ensure(tlsDir, "client", pki.LeafSpec{CommonName: "k3sm", Client: true})
	if err != nil {
		return nil, err
	}
	client := fmt.Sprintf("https://127.0.0.1:%d", o.Port)
	peer := fmt.Sprintf("http://127.0.0.1:%d", o.PeerPort)
	args := []string{"--name=k3sm-test", "--data-dir=" + filepath.Join(o.Dir, "data"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer, "--initial-cluster=k3sm-test=" + peer,
		"--cert-file=" + srv.CertPath, "--key-file=" + srv.KeyPath, "--trusted-ca-file=" + ca.CertPath, "--client-cert-auth"}
	if !o.Durable {
		args = append(args, "--unsafe-no-fsync")
	}
	d, err := start("etcd", exec.Command(bin, args...), o.Dir, o.Port)
	if err != nil {
		return nil, err
	}
	d.Endpoint = client
	d.Flags = []string{"--datastore-cafile=" + ca.CertPath, "--datastore-certfile=" + cli.CertPath, "--datastore-keyfile=" + cli.KeyPath}
	return d, nil
}

// ForTest starts a database with start on free loopback ports (a peer port
// too when peer), in a directory PostgreSQL's account can reach (not
// t.TempDir: as root it runs as postgres, which must pass through the
// parents); it is stopped, its log shown if t failed, and its directory
// removed when t ends.
func ForTest(t testing.TB, start func(o Options) (*DB, error), peer bool) *DB {
	t.Helper()
	dir, err := os.MkdirTemp("", "k3sm-db-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	o := Options{Dir: dir}
	if o.Port, err = ports.Free(); err == nil && peer {
		o.PeerPort, err = ports.Free()
	}
	if err != nil {
		t.Fatal(err)
	}
	d, err := start(o)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() {
			t.Logf("%s's log:\n%s", d.Name, d.Log())
		}
		os.RemoveAll(dir)
	})
	return d
}
