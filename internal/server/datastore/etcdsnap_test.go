package datastore

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startEmbedded runs an etcd member in the test's process on loopback
// ports and returns the datastore config that reaches it.
func startEmbedded(t *testing.T) Config {
	t.Helper()
	port := func() *url.URL {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return &url.URL{Scheme: "http", Host: l.Addr().String()}
	}
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(t.TempDir(), "etcd")
	cfg.Logger, cfg.LogLevel = "zap", "error"
	client, peer := port(), port()
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		t.Fatal("etcd not ready after 1m")
	}
	return Config{Endpoint: client.String()}
}

// An etcd snapshot taken through the API holds the live keys (a deleted
// key is gone, a rewritten one has its last value), and loading it into a
// new member writes exactly those, leased keys left out.
func TestEtcdSnapshotIntegration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd members")
	}
	src := startEmbedded(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{src.Endpoint}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 100 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/registry/configmaps/default/cm-%03d", i), fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	cli.Delete(ctx, "/registry/configmaps/default/cm-001")
	cli.Put(ctx, "/registry/configmaps/default/cm-002", "rewritten")
	cli.Delete(ctx, "/registry/configmaps/default/cm-003")
	cli.Put(ctx, "/registry/configmaps/default/cm-003", "again")
	lease, err := cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	cli.Put(ctx, "/registry/masterleases/192.0.2.1", "leased", clientv3.WithLease(lease.ID))

	path := filepath.Join(t.TempDir(), "etcd.snapshot")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := src.EtcdSnapshot(ctx, f)
	f.Close()
	if err != nil || n == 0 {
		t.Fatalf("EtcdSnapshot: %d bytes, %v", n, err)
	}
	kvs, err := EtcdSnapshotKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range kvs {
		if _, dup := got[string(kv.Key)]; dup {
			t.Errorf("key %s listed twice", kv.Key)
		}
		got[string(kv.Key)] = string(kv.Value)
	}
	if len(got) != 100 || got["/registry/configmaps/default/cm-002"] != "rewritten" || got["/registry/configmaps/default/cm-003"] != "again" {
		t.Errorf("snapshot keys: %d, cm-002 %q, cm-003 %q", len(got), got["/registry/configmaps/default/cm-002"], got["/registry/configmaps/default/cm-003"])
	}
	if _, ok := got["/registry/configmaps/default/cm-001"]; ok {
		t.Errorf("a deleted key is in the snapshot's live keys")
	}

	dst := startEmbedded(t)
	loaded, err := dst.EtcdLoad(ctx, path)
	if err != nil || loaded != 99 {
		t.Fatalf("EtcdLoad: %d keys, %v; want 99 (the leased key left out)", loaded, err)
	}
	dcli, err := clientv3.New(clientv3.Config{Endpoints: []string{dst.Endpoint}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer dcli.Close()
	resp, err := dcli.Get(ctx, "/registry/", clientv3.WithPrefix())
	if err != nil || resp.Count != 99 {
		t.Fatalf("loaded member: %v keys, %v", resp, err)
	}
	if _, err := EtcdSnapshotKeys(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Errorf("a missing snapshot file read without error")
	}
	bogus := filepath.Join(t.TempDir(), "bogus")
	os.WriteFile(bogus, []byte("not a database"), 0o600)
	if _, err := EtcdSnapshotKeys(bogus); err == nil {
		t.Errorf("a file that is not a snapshot read without error")
	}
}
