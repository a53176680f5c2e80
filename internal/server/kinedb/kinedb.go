// Package kinedb reads kine's SQLite datastore directly, beside a running
// kine: a consistent online copy (VACUUM INTO) for snapshots, and the raw
// stored values of keys (to see how Secrets are encrypted at rest). It uses
// the same pure-Go driver kine is built with (modernc.org/sqlite), so
// CGO_ENABLED=0 builds keep working.
package kinedb

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// DB is an open kine datastore.
type DB struct{ db *sql.DB }

// Open opens the datastore at path, which must exist. Writers (kine) are
// waited for up to 30 s; nothing here writes.
func Open(path string) (*DB, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(30000)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return &DB{db: db}, nil
}

// Close closes the database.
func (d *DB) Close() error { return d.db.Close() }

// CopyTo writes a consistent copy of the whole database to dst (which must
// not exist) while kine keeps running: VACUUM INTO reads one snapshot of the
// database, WAL included, and writes it as a standalone file.
func (d *DB) CopyTo(ctx context.Context, dst string) error {
	if _, err := d.db.ExecContext(ctx, "VACUUM INTO ?", dst); err != nil {
		return fmt.Errorf("copy the datastore: %w", err)
	}
	return nil
}

// Check runs SQLite's integrity check.
func (d *DB) Check(ctx context.Context) error {
	var res string
	if err := d.db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&res); err != nil {
		return err
	}
	if res != "ok" {
		return fmt.Errorf("integrity check: %s", res)
	}
	return nil
}

// Latest calls fn with the current value of every live key under prefix
// (kine keeps each revision as a row; the newest row of a name is its
// current state, a deletion when its deleted flag is set).
func (d *DB) Latest(ctx context.Context, prefix string, fn func(key string, value []byte) error) error {
	rows, err := d.db.QueryContext(ctx, `SELECT k.name, k.value FROM kine AS k
		JOIN (SELECT MAX(id) AS id FROM kine WHERE name >= ? AND name < ? GROUP BY name) AS m ON k.id = m.id
		WHERE k.deleted = 0 ORDER BY k.name`, prefix, prefixEnd(prefix))
	if err != nil {
		return fmt.Errorf("read the datastore: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var value []byte
		if err := rows.Scan(&key, &value); err != nil {
			return err
		}
		if err := fn(key, value); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Value returns the current value of key, or ok false when it does not
// exist (or is deleted).
func (d *DB) Value(ctx context.Context, key string) (value []byte, ok bool, err error) {
	var deleted int
	err = d.db.QueryRowContext(ctx, "SELECT value, deleted FROM kine WHERE name = ? ORDER BY id DESC LIMIT 1", key).Scan(&value, &deleted)
	if err == sql.ErrNoRows {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return value, deleted == 0, nil
}

// prefixEnd is the smallest string greater than every string starting with p.
func prefixEnd(p string) string {
	b := []byte(p)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return strings.Repeat("\xff", len(p)+1)
}
