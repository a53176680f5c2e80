// Package datastore owns the choice of the control plane's datastore: the
// embedded SQLite file (the default), or an existing database named by
// --datastore-endpoint: PostgreSQL or MySQL/MariaDB through kine, or etcd
// spoken to directly by the kube-apiserver. It parses and checks the flag
// and its TLS files, checks that the database answers before anything
// starts, shows the endpoint without its password, and keeps the record in
// the data directory of which datastore holds the cluster, so a restart on
// another one is refused instead of starting an empty cluster.
package datastore

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// Kind is the engine behind the endpoint.
type Kind string

const (
	SQLite   Kind = "sqlite"
	Postgres Kind = "postgres"
	MySQL    Kind = "mysql"
	Etcd     Kind = "etcd"
)

// Flag names, for errors.
const (
	FlagEndpoint = "datastore-endpoint"
	FlagCAFile   = "datastore-cafile"
	FlagCertFile = "datastore-certfile"
	FlagKeyFile  = "datastore-keyfile"
)

// Config is what the server was given.
type Config struct {
	// Endpoint is empty for the embedded SQLite datastore, else
	// postgres://, mysql:// or http(s):// (etcd; several comma-separated).
	Endpoint string `json:"endpoint,omitempty"`
	// CAFile, CertFile, KeyFile: TLS to the database (optional).
	CAFile   string `json:"caFile,omitempty"`
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// Embedded marks the server's own etcd member (--cluster-init): etcd
	// on loopback with the cluster's etcd CA, not a flag the user gave.
	Embedded bool `json:"embedded,omitempty"`
}

// FieldError names the flag at fault and what to do about it (the
// server's flags all use it: controlplane.FieldError).
type FieldError struct {
	Flag, Value, Problem, Fix string
}

func (e *FieldError) Error() string {
	msg := fmt.Sprintf("--%s %q: %s", e.Flag, e.Value, e.Problem)
	if e.Fix != "" {
		msg += "; " + e.Fix
	}
	return msg
}

// Kind says which engine c names; Validate has checked it.
func (c Config) Kind() Kind {
	scheme, _, _ := strings.Cut(c.Endpoint, "://")
	switch strings.ToLower(scheme) {
	case "", "sqlite":
		return SQLite
	case "postgres", "postgresql":
		return Postgres
	case "mysql":
		return MySQL
	case "http", "https":
		return Etcd
	}
	return ""
}

// External reports whether the cluster lives outside the data directory.
func (c Config) External() bool { return c.Endpoint != "" && c.Kind() != SQLite }

// Validate checks the endpoint's form and the TLS files without
// connecting; each problem names its flag and the fix.
func (c Config) Validate() []*FieldError {
	var errs []*FieldError
	add := func(flag, value, problem, fix string) {
		errs = append(errs, &FieldError{Flag: flag, Value: value, Problem: problem, Fix: fix})
	}
	shown := c.Redacted()
	const forms = "use postgres://USER:PASSWORD@HOST:5432/DB, mysql://USER:PASSWORD@tcp(HOST:3306)/DB, https://HOST:2379 (etcd), or leave it unset for the embedded SQLite"
	switch k := c.Kind(); {
	case c.Endpoint == "":
	case !strings.Contains(c.Endpoint, "://"):
		add(FlagEndpoint, shown, "not a URL (no scheme://)", forms)
	case k == "":
		add(FlagEndpoint, shown, "unknown scheme", forms)
	case k == SQLite:
		add(FlagEndpoint, shown, "the embedded SQLite datastore lives in --data-dir and takes no endpoint", "leave --datastore-endpoint unset")
	case k == Postgres:
		u, err := url.Parse(c.Endpoint)
		if err != nil {
			add(FlagEndpoint, shown, "not a PostgreSQL URL: "+unquote(err), forms)
		} else if u.Host == "" && u.Query().Get("host") == "" {
			add(FlagEndpoint, shown, "names no host", "use postgres://USER:PASSWORD@HOST:5432/DB (or ?host=/path/to/socket-dir)")
		}
	case k == MySQL:
		_, dsn, _ := strings.Cut(c.Endpoint, "://")
		if _, err := mysql.ParseDSN(dsn); err != nil {
			add(FlagEndpoint, shown, "not a MySQL data source name: "+err.Error(), "use mysql://USER:PASSWORD@tcp(HOST:3306)/DB or mysql://USER@unix(/path/mysqld.sock)/DB")
		}
	case k == Etcd:
		for _, ep := range c.EtcdEndpoints() {
			u, err := url.Parse(ep)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
				add(FlagEndpoint, shown, fmt.Sprintf("%q is not an etcd client URL", ep), "use https://HOST:2379, several separated by commas")
			}
		}
	}
	for _, f := range []struct{ flag, path string }{{FlagCAFile, c.CAFile}, {FlagCertFile, c.CertFile}, {FlagKeyFile, c.KeyFile}} {
		if f.path == "" || c.Embedded {
			continue // the embedded member's files are made at start
		}
		if !c.External() {
			add(f.flag, f.path, "given without an external --datastore-endpoint", "drop it, or name the database with --datastore-endpoint")
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			add(f.flag, f.path, "cannot be read: "+unquote(err), "give the path of an existing PEM file")
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		flag, v := FlagCertFile, c.CertFile
		if c.CertFile == "" {
			flag, v = FlagKeyFile, c.KeyFile
		}
		add(flag, v, "given without --"+map[string]string{FlagCertFile: FlagKeyFile, FlagKeyFile: FlagCertFile}[flag], "give the client certificate and its key together")
	}
	return errs
}

// EtcdEndpoints are the comma-separated URLs of an etcd endpoint.
func (c Config) EtcdEndpoints() []string {
	var out []string
	for _, ep := range strings.Split(c.Endpoint, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			out = append(out, ep)
		}
	}
	return out
}

// Redacted is the endpoint without its password, for logs, errors and
// `k3sm status`.
func (c Config) Redacted() string {
	if c.Embedded {
		return "etcd (embedded, " + c.Endpoint + ")"
	}
	switch c.Kind() {
	case "", SQLite:
		if c.Endpoint == "" {
			return "sqlite (embedded)"
		}
	case MySQL:
		scheme, dsn, _ := strings.Cut(c.Endpoint, "://")
		if cfg, err := mysql.ParseDSN(dsn); err == nil {
			if cfg.Passwd != "" {
				cfg.Passwd = "xxxxx"
			}
			return scheme + "://" + cfg.FormatDSN()
		}
		return scheme + "://" + redactUserinfo(dsn)
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil {
		scheme, rest, _ := strings.Cut(c.Endpoint, "://")
		return scheme + "://" + redactUserinfo(rest)
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// redactUserinfo hides what follows the first ':' of a "user:password@"
// prefix in a string that did not parse.
func redactUserinfo(s string) string {
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return s
	}
	user, _, found := strings.Cut(s[:at], ":")
	if !found {
		return s
	}
	return user + ":xxxxx" + s[at:]
}

// Identity names the database the cluster lives in, without credentials
// or options: the same database reached with another password or TLS
// file has the same identity.
func (c Config) Identity() string {
	if c.Embedded {
		return "etcd (embedded)"
	}
	switch c.Kind() {
	case SQLite:
		return string(SQLite)
	case MySQL:
		_, dsn, _ := strings.Cut(c.Endpoint, "://")
		if cfg, err := mysql.ParseDSN(dsn); err == nil {
			return fmt.Sprintf("mysql://%s(%s)/%s", cfg.Net, cfg.Addr, cfg.DBName)
		}
	case Postgres:
		if u, err := url.Parse(c.Endpoint); err == nil {
			host := u.Host
			if host == "" {
				host = u.Query().Get("host")
			}
			db := strings.ToLower(strings.TrimPrefix(u.Path, "/"))
			if db == "" {
				db = DefaultDatabase
			}
			return "postgres://" + host + "/" + db
		}
	case Etcd:
		var hosts []string
		for _, ep := range c.EtcdEndpoints() {
			if u, err := url.Parse(ep); err == nil {
				hosts = append(hosts, u.Host)
			}
		}
		return "etcd://" + strings.Join(hosts, ",")
	}
	return c.Redacted()
}

// DefaultDatabase is the database kine uses when a PostgreSQL URL names none.
const DefaultDatabase = "kubernetes"

// unquote is an error's text without Go's quoting of the input (which may
// hold the password).
func unquote(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
