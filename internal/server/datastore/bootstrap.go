package datastore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BootstrapTable (PostgreSQL, MySQL) and BootstrapPrefix (etcd) hold the
// servers' sealed bootstrap records, beside the cluster's own data but
// outside what the apiserver reads: in a table of k3sm's own next to
// kine's, and under a prefix outside /registry.
const (
	BootstrapTable  = "k3sm_bootstrap"
	BootstrapPrefix = "/k3sm/bootstrap/"
)

// BootstrapStore keeps opaque records by id (a join token's id) in the
// cluster's database, where a server that joins the cluster reads one
// before anything of its own runs.
type BootstrapStore interface {
	// Get returns the record of id; ok is false when there is none.
	Get(ctx context.Context, id string) (value []byte, ok bool, err error)
	Put(ctx context.Context, id string, value []byte) error
	Delete(ctx context.Context, id string) error
	// List returns the ids that have a record, sorted.
	List(ctx context.Context) ([]string, error)
	Close() error
}

// Bootstrap opens the store of c's database. The embedded SQLite datastore
// has none: its cluster has one server.
func (c Config) Bootstrap() (BootstrapStore, error) {
	switch c.Kind() {
	case Postgres:
		u, err := c.pgURL()
		if err != nil {
			return nil, err
		}
		db, err := sql.Open("pgx", u.String())
		if err != nil {
			return nil, errors.New(redactErr(err.Error(), u))
		}
		return &sqlStore{db: db, postgres: true, redact: func(s string) string { return redactErr(s, u) }}, nil
	case MySQL:
		db, err := c.mysqlDB()
		if err != nil {
			return nil, err
		}
		return &sqlStore{db: db, redact: func(s string) string { return s }}, nil
	case Etcd:
		cli, err := c.etcdClient()
		if err != nil {
			return nil, err
		}
		return etcdStore{cli}, nil
	}
	return nil, errors.New("the embedded SQLite datastore keeps no bootstrap records: its cluster has one server")
}

type sqlStore struct {
	db       *sql.DB
	postgres bool
	redact   func(string) string
}

func (s *sqlStore) err(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s the bootstrap record: %s", what, s.redact(err.Error()))
}

// missingTable reports the error of a table that does not exist yet: no
// server has written a record.
func missingTable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == pgUndefinedTable {
		return true
	}
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == mysqlNoSuchTable
}

func (s *sqlStore) q(query string) string {
	if !s.postgres {
		return query
	}
	// database/sql's placeholders are the driver's: $1, $2 for pgx.
	n := 0
	var b strings.Builder
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (s *sqlStore) Get(ctx context.Context, id string) ([]byte, bool, error) {
	var v []byte
	err := s.db.QueryRowContext(ctx, s.q("SELECT value FROM "+BootstrapTable+" WHERE id = ?"), id).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) || missingTable(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, s.err("read", err)
	}
	return v, true, nil
}

func (s *sqlStore) Put(ctx context.Context, id string, value []byte) error {
	create := "CREATE TABLE IF NOT EXISTS " + BootstrapTable + " (id VARCHAR(64) PRIMARY KEY, value MEDIUMBLOB NOT NULL)"
	upsert := "INSERT INTO " + BootstrapTable + " (id, value) VALUES (?, ?) ON DUPLICATE KEY UPDATE value = VALUES(value)"
	if s.postgres {
		create = "CREATE TABLE IF NOT EXISTS " + BootstrapTable + " (id VARCHAR(64) PRIMARY KEY, value BYTEA NOT NULL)"
		upsert = "INSERT INTO " + BootstrapTable + " (id, value) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value"
	}
	// PostgreSQL's CREATE TABLE IF NOT EXISTS fails when another server
	// creates the table at the same moment: the write then tells.
	_, cerr := s.db.ExecContext(ctx, create)
	if _, err := s.db.ExecContext(ctx, s.q(upsert), id, value); err != nil {
		if cerr != nil {
			return s.err("make the table of", cerr)
		}
		return s.err("write", err)
	}
	return nil
}

func (s *sqlStore) Delete(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, s.q("DELETE FROM "+BootstrapTable+" WHERE id = ?"), id)
	if missingTable(err) {
		return nil
	}
	return s.err("delete", err)
}

func (s *sqlStore) List(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT id FROM "+BootstrapTable+" ORDER BY id")
	if missingTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, s.err("list", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, s.err("list", err)
		}
		ids = append(ids, id)
	}
	return ids, s.err("list", rows.Err())
}

func (s *sqlStore) Close() error { return s.db.Close() }

type etcdStore struct{ cli *clientv3.Client }

func (e etcdStore) Get(ctx context.Context, id string) ([]byte, bool, error) {
	resp, err := e.cli.Get(ctx, BootstrapPrefix+id)
	if err != nil {
		return nil, false, fmt.Errorf("read the bootstrap record: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false, nil
	}
	return resp.Kvs[0].Value, true, nil
}

func (e etcdStore) Put(ctx context.Context, id string, value []byte) error {
	if _, err := e.cli.Put(ctx, BootstrapPrefix+id, string(value)); err != nil {
		return fmt.Errorf("write the bootstrap record: %w", err)
	}
	return nil
}

func (e etcdStore) Delete(ctx context.Context, id string) error {
	if _, err := e.cli.Delete(ctx, BootstrapPrefix+id); err != nil {
		return fmt.Errorf("delete the bootstrap record: %w", err)
	}
	return nil
}

func (e etcdStore) List(ctx context.Context) ([]string, error) {
	resp, err := e.cli.Get(ctx, BootstrapPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("list the bootstrap records: %w", err)
	}
	ids := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		ids = append(ids, strings.TrimPrefix(string(kv.Key), BootstrapPrefix))
	}
	sort.Strings(ids)
	return ids, nil
}

func (e etcdStore) Close() error { return e.cli.Close() }
