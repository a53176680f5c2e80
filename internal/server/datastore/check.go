package datastore

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Check connects to the database once and returns nil when it answers. A
// database that does not exist yet answers: kine creates it. The error
// says what failed, without the password.
func (c Config) Check(ctx context.Context) error {
	switch c.Kind() {
	case Postgres:
		return c.checkPostgres(ctx)
	case MySQL:
		return c.checkMySQL(ctx)
	case Etcd:
		return c.checkEtcd(ctx)
	}
	return nil
}

// WaitAnswer retries Check until it succeeds or wait has passed (a
// database started at the same time as the server), then returns a
// FieldError naming --datastore-endpoint.
func (c Config) WaitAnswer(ctx context.Context, wait time.Duration, progress func(error)) error {
	deadline := time.Now().Add(wait)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.Check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return &FieldError{Flag: FlagEndpoint, Value: c.Redacted(), Problem: "the database does not answer: " + err.Error(),
				Fix: "start it, or check the host, port, user, password and --datastore-cafile/certfile/keyfile; nothing was started"}
		}
		if progress != nil {
			progress(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// pgUndefinedDatabase is PostgreSQL's SQLSTATE invalid_catalog_name.
const pgUndefinedDatabase = "3D000"

// pgURL is the endpoint as kine's PostgreSQL driver connects: its
// default database, the name folded to lower case, the TLS files.
func (c Config) pgURL() (*url.URL, error) {
	u, err := url.Parse(c.Endpoint)
	if err != nil {
		return nil, errors.New(unquote(err))
	}
	u.Scheme = "postgres"
	if u.Path == "" || u.Path == "/" {
		u.Path = "/" + DefaultDatabase
	}
	u.Path = strings.ToLower(u.Path) // as kine folds it
	// The TLS files as kine passes them (verify-full once any is given).
	q := u.Query()
	any := false
	for k, v := range map[string]string{"sslrootcert": c.CAFile, "sslcert": c.CertFile, "sslkey": c.KeyFile} {
		if v != "" && !q.Has(k) {
			q.Set(k, v)
			any = true
		}
	}
	if any && !q.Has("sslmode") {
		q.Set("sslmode", "verify-full")
	}
	u.RawQuery = q.Encode()
	return u, nil
}

func (c Config) checkPostgres(ctx context.Context) error {
	u, err := c.pgURL()
	if err != nil {
		return err
	}
	conn, err := pgconn.Connect(ctx, u.String())
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == pgUndefinedDatabase {
			return nil
		}
		return errors.New(redactErr(err.Error(), u))
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// mysqlBadDB is MySQL's ER_BAD_DB_ERROR (unknown database).
const mysqlBadDB = 1049

// mysqlDB opens the endpoint as kine's MySQL driver does, with the TLS files.
func (c Config) mysqlDB() (*sql.DB, error) {
	_, dsn, _ := strings.Cut(c.Endpoint, "://")
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if c.CAFile != "" || c.CertFile != "" {
		t, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		if host, _, ok := strings.Cut(cfg.Addr, ":"); ok {
			t.ServerName = host
		}
		cfg.TLS = t
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}

func (c Config) checkMySQL(ctx context.Context) error {
	db, err := c.mysqlDB()
	if err != nil {
		return err
	}
	defer db.Close()
	err = db.PingContext(ctx)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == mysqlBadDB {
		return nil
	}
	return err
}

func (c Config) etcdClient() (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: c.EtcdEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if c.CAFile != "" || c.CertFile != "" {
		t, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLS = t
	}
	return clientv3.New(cfg)
}

func (c Config) checkEtcd(ctx context.Context) error {
	cli, err := c.etcdClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	var errs []error
	for _, ep := range c.EtcdEndpoints() {
		if _, err := cli.Status(ctx, ep); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		return nil // the apiserver needs one member that answers
	}
	return errors.Join(errs...)
}

// TLSConfig is the client TLS of the datastore flags (nil without any).
func (c Config) TLSConfig() (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" {
		return nil, nil
	}
	return c.tlsConfig()
}

// tlsConfig is the client TLS of the datastore flags, loaded as kine and
// the apiserver load them (etcd's transport.TLSInfo).
func (c Config) tlsConfig() (*tls.Config, error) {
	t, err := (&transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("--%s/--%s/--%s: %w", FlagCAFile, FlagCertFile, FlagKeyFile, err)
	}
	return t, nil
}

// redactErr removes the URL's password from a driver's message.
func redactErr(msg string, u *url.URL) string {
	if p, ok := u.User.Password(); ok && p != "" {
		msg = strings.ReplaceAll(msg, p, "xxxxx")
	}
	return msg
}

// clusterKey is a key every cluster has from its first start (the default
// namespace), as kine and the apiserver store it.
const clusterKey = "/registry/namespaces/default"

// pgUndefinedTable is PostgreSQL's SQLSTATE undefined_table.
const pgUndefinedTable = "42P01"

// mysqlNoSuchTable is MySQL's ER_NO_SUCH_TABLE.
const mysqlNoSuchTable = 1146

// HoldsCluster reports whether the database already holds a Kubernetes
// cluster (one made by another server's data dir): a new data dir's
// server would serve it with certificates of its own. A database, or
// kine's table, that does not exist yet holds none.
func (c Config) HoldsCluster(ctx context.Context) (bool, error) {
	switch c.Kind() {
	case Postgres:
		u, err := c.pgURL()
		if err != nil {
			return false, err
		}
		conn, err := pgconn.Connect(ctx, u.String())
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == pgUndefinedDatabase {
				return false, nil
			}
			return false, errors.New(redactErr(err.Error(), u))
		}
		defer conn.Close(context.Background())
		res := conn.ExecParams(ctx, "SELECT count(*) FROM kine WHERE name = $1", [][]byte{[]byte(clusterKey)}, nil, nil, nil).Read()
		if res.Err != nil {
			var pe *pgconn.PgError
			if errors.As(res.Err, &pe) && pe.Code == pgUndefinedTable {
				return false, nil
			}
			return false, res.Err
		}
		return len(res.Rows) == 1 && string(res.Rows[0][0]) != "0", nil
	case MySQL:
		db, err := c.mysqlDB()
		if err != nil {
			return false, err
		}
		defer db.Close()
		var n int
		err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM kine WHERE name = ?", clusterKey).Scan(&n)
		var me *mysql.MySQLError
		if errors.As(err, &me) && (me.Number == mysqlBadDB || me.Number == mysqlNoSuchTable) {
			return false, nil
		}
		return n > 0, err
	case Etcd:
		cli, err := c.etcdClient()
		if err != nil {
			return false, err
		}
		defer cli.Close()
		resp, err := cli.Get(ctx, clusterKey, clientv3.WithCountOnly())
		if err != nil {
			return false, err
		}
		return resp.Count > 0, nil
	}
	return false, nil
}
