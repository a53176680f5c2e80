package datastore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// EtcdSnapshot streams a snapshot of c's etcd (etcd's maintenance API, as
// `etcdctl snapshot save`) into w and returns its size.
func (c Config) EtcdSnapshot(ctx context.Context, w io.Writer) (int64, error) {
	if c.Kind() != Etcd {
		return 0, errors.New("not an etcd datastore")
	}
	cli, err := c.etcdClient()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		return 0, fmt.Errorf("etcd snapshot: %w", err)
	}
	defer rc.Close()
	n, err := io.Copy(w, rc)
	if err != nil {
		return n, fmt.Errorf("etcd snapshot: %w", err)
	}
	return n, nil
}

// keyBucket is where etcd's backend keeps the key-value history: keys are
// revisions (8 bytes main, '_', 8 bytes sub, and 't' for a deletion),
// values mvccpb.KeyValue.
var keyBucket = []byte("key")

// EtcdSnapshotKeys reads the live keys of an etcd snapshot file (the last
// revision of each key not deleted), in key order of their last write.
func EtcdSnapshotKeys(path string) ([]*mvccpb.KeyValue, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("%s: not an etcd snapshot: %w", path, err)
	}
	defer db.Close()
	live := map[string]*mvccpb.KeyValue{}
	var order []string
	listed := map[string]bool{}
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(keyBucket)
		if b == nil {
			return fmt.Errorf("%s: not an etcd snapshot (no key bucket)", path)
		}
		// Revisions ascend: the last write of a key wins.
		return b.ForEach(func(rev, v []byte) error {
			var kv mvccpb.KeyValue
			if err := proto.Unmarshal(v, &kv); err != nil {
				return fmt.Errorf("%s: revision %x: %w", path, rev, err)
			}
			k := string(kv.Key)
			if len(rev) == 18 && rev[17] == 't' {
				delete(live, k)
				return nil
			}
			if !listed[k] { // a key deleted and written again is listed once
				listed[k] = true
				order = append(order, k)
			}
			live[k] = &kv
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	out := make([]*mvccpb.KeyValue, 0, len(live))
	for _, k := range order {
		if kv, ok := live[k]; ok {
			out = append(out, kv)
		}
	}
	return out, nil
}

// EtcdLoad writes the live keys of the etcd snapshot at path into c's
// etcd (a new, empty member), without the leases they were bound to:
// the apiserver's own leased keys (its endpoint lease, events) are made
// again by it. It returns the number of keys written.
func (c Config) EtcdLoad(ctx context.Context, path string) (int, error) {
	kvs, err := EtcdSnapshotKeys(path)
	if err != nil {
		return 0, err
	}
	cli, err := c.etcdClient()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	n := 0
	const batch = 64
	for i := 0; i < len(kvs); i += batch {
		var ops []clientv3.Op
		for _, kv := range kvs[i:min(i+batch, len(kvs))] {
			if kv.Lease != 0 {
				continue
			}
			ops = append(ops, clientv3.OpPut(string(kv.Key), string(kv.Value)))
		}
		if len(ops) == 0 {
			continue
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return n, fmt.Errorf("loading the snapshot: %w", err)
		}
		n += len(ops)
	}
	return n, nil
}
