package encryption

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
)

func TestConfigLoadsInTheAPIServer(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	k1, _ := NewKey(now)
	k2, _ := NewKey(now.Add(time.Second))
	path := filepath.Join(t.TempDir(), "enc.yaml")
	data, err := Write(path, []Key{k2, k1})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", st.Mode().Perm())
	}
	// The apiserver's own loader accepts it and names it by the hash the
	// rotation waits for.
	cfg, err := encryptionconfig.LoadEncryptionConfig(context.Background(), path, true, "test")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.EncryptionFileContentHash != ConfigHash(data) {
		t.Fatalf("apiserver hash %s, ours %s", cfg.EncryptionFileContentHash, ConfigHash(data))
	}
	keys, err := Read(path)
	if err != nil || len(keys) != 2 || keys[0].Name != "k3sm-20261201-100001" {
		t.Fatalf("keys %v %v", keys, err)
	}
}

func TestKeyOf(t *testing.T) {
	for in, want := range map[string]string{
		"k8s:enc:aescbc:v1:k3sm-1:\x00\x01binary": "k3sm-1",
		"k8s\x00\x0a\x02v1...":                    "identity",
		"k8s:enc:aescbc":                          "unknown",
	} {
		if got := KeyOf([]byte(in)); got != want {
			t.Errorf("KeyOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPrepareOnlyWhenTheClusterIsCreated(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	now := time.Now()
	l := datadir.New(t.TempDir())
	os.MkdirAll(l.CredDir(), 0o700)
	os.MkdirAll(l.DBDir(), 0o700)

	// Off, new cluster: nothing.
	if p, err := Prepare(l, false, log, now); p != "" || err != nil {
		t.Fatalf("off: %q %v", p, err)
	}
	// Flag on an existing cluster without encryption: a warning, no config.
	os.WriteFile(l.DBFile(), nil, 0o600)
	if p, err := Prepare(l, true, log, now); p != "" || err != nil {
		t.Fatalf("existing cluster: %q %v", p, err)
	}
	if !strings.Contains(logs.String(), "takes effect only on the start that creates the cluster") {
		t.Fatalf("no warning: %s", logs.String())
	}
	// New cluster with the flag: a config; later starts keep it with or without the flag.
	os.Remove(l.DBFile())
	p, err := Prepare(l, true, log, now)
	if err != nil || p != l.EncryptionConfig() {
		t.Fatalf("new cluster: %q %v", p, err)
	}
	os.WriteFile(l.DBFile(), nil, 0o600)
	if p2, err := Prepare(l, false, log, now); p2 != p || err != nil {
		t.Fatalf("a cluster created encrypted must stay so without the flag: %q %v", p2, err)
	}
}
