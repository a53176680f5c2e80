package serverboot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// memStore is a datastore.BootstrapStore in memory; the real engines are
// tested in internal/server/datastore.
type memStore struct {
	mu   sync.Mutex
	recs map[string][]byte
	puts int
}

func newMemStore() *memStore { return &memStore{recs: map[string][]byte{}} }

func (m *memStore) Get(_ context.Context, id string) ([]byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.recs[id]
	return bytes.Clone(v), ok, nil
}

func (m *memStore) Put(_ context.Context, id string, value []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs[id] = bytes.Clone(value)
	m.puts++
	return nil
}

func (m *memStore) Delete(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, id)
	return nil
}

func (m *memStore) List(context.Context) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.recs)), nil
}

func (m *memStore) Close() error { return nil }

func (m *memStore) putCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.puts
}

var _ datastore.BootstrapStore = (*memStore)(nil)

// cluster makes a data dir with the CAs and service-account key a
// server's first start makes (controlplane.EnsurePKI).
func cluster(t *testing.T) datadir.Layout {
	t.Helper()
	l := datadir.New(t.TempDir())
	if err := os.MkdirAll(l.TLSDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, ca := range []string{"server-ca", "client-ca", "request-header-ca"} {
		if _, err := pki.LoadOrCreateCA(l.TLSDir(), ca, "k3sm-"+ca); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pki.EnsureKey(l.ServiceAccountKey()); err != nil {
		t.Fatal(err)
	}
	return l
}

func tokenOfCluster(t *testing.T, l datadir.Layout, id, secret string) joinv1.Token {
	t.Helper()
	ca, err := os.ReadFile(l.TLS("server-ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	return joinv1.Token{CAHash: joinv1.CAHash(ca), ID: id, Secret: secret}
}

func addEncryption(t *testing.T, l datadir.Layout) []byte {
	t.Helper()
	cfg := []byte("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n# key: c2VjcmV0\n")
	if err := os.MkdirAll(filepath.Dir(l.EncryptionConfig()), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.EncryptionConfig(), cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// tree lists every file and directory under root with its mode.
func tree(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	out := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out[filepath.ToSlash(rel)] = info.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func empty(t *testing.T, l datadir.Layout) {
	t.Helper()
	if got := tree(t, l.Root); len(got) != 0 {
		t.Errorf("the data dir was written to: %v", slices.Sorted(maps.Keys(got)))
	}
}

var testSettings = Settings("10.42.0.0/16", "10.43.0.0/16", "10.43.0.10", "cluster.local")

func TestSealOpen(t *testing.T) {
	t.Parallel()
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	b := Bundle{
		Files:    map[string][]byte{"server/tls/server-ca.key": {0, 1, 0xff, 'P', 'L', 'A', 'I', 'N'}, "server/tls/x": []byte("marker-3b1f9c")},
		Settings: map[string]string{"service-cidr": "10.43.0.0/16"},
		Expires:  &exp,
	}
	tok := joinv1.Token{ID: "abcdef", Secret: "0123456789abcdef"}
	rec, err := Seal(b, tok)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{tok.Secret, "marker-3b1f9c", "10.43.0.0"} {
		if bytes.Contains(rec, []byte(s)) {
			t.Errorf("the sealed record shows %q in clear", s)
		}
	}

	got, err := Open(rec, tok)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if !maps.EqualFunc(got.Files, b.Files, bytes.Equal) || !maps.Equal(got.Settings, b.Settings) || got.Expires == nil || !got.Expires.Equal(exp) {
		t.Errorf("Open returned %+v, want %+v", got, b)
	}

	if _, err := Open(rec, joinv1.Token{ID: tok.ID, Secret: "fedcba9876543210"}); !errors.Is(err, ErrWrongToken) {
		t.Errorf("Open with another secret: %v, want ErrWrongToken", err)
	}
	// The id is authenticated: the record of abcdef is not that of
	// another id with the same secret.
	if _, err := Open(rec, joinv1.Token{ID: "zzzzzz", Secret: tok.Secret}); !errors.Is(err, ErrWrongToken) {
		t.Errorf("Open as another id: %v, want ErrWrongToken", err)
	}

	var s sealed
	if err := json.Unmarshal(rec, &s); err != nil {
		t.Fatal(err)
	}
	reseal := func(f func(*sealed)) []byte {
		c := s
		c.Data, c.Salt, c.Nonce = bytes.Clone(s.Data), bytes.Clone(s.Salt), bytes.Clone(s.Nonce)
		f(&c)
		out, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, c := range []struct {
		name   string
		record []byte
		want   string
	}{
		{"not JSON", []byte("\x00\xffgarbage"), "not one k3sm wrote"},
		{"truncated", rec[:len(rec)/2], "not one k3sm wrote"},
		{"empty", nil, "not one k3sm wrote"},
		{"other version", reseal(func(c *sealed) { c.Version = 2 }), "version 2, this k3sm reads 1"},
		{"no version", reseal(func(c *sealed) { c.Version = 0 }), "version 0, this k3sm reads 1"},
		{"short salt", reseal(func(c *sealed) { c.Salt = c.Salt[:4] }), "damaged (salt)"},
		{"short nonce", reseal(func(c *sealed) { c.Nonce = c.Nonce[:4] }), "damaged (nonce)"},
		{"flipped byte", reseal(func(c *sealed) { c.Data[len(c.Data)/2] ^= 1 }), ErrWrongToken.Error()},
	} {
		_, err := Open(c.record, tok)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Open: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

func TestCollectInstall(t *testing.T) {
	src := cluster(t)
	shared := SharedFiles(src)
	if len(shared) != 10 || !slices.Contains(shared, "server/tls/etcd-ca.key") || !slices.Contains(shared, "server/tls/server-ca.key") || !slices.Contains(shared, "server/tls/service-account.key") ||
		!slices.Contains(shared, "server/cred/encryption-config.yaml") {
		t.Fatalf("SharedFiles = %v", shared)
	}
	// The source has no embedded etcd, so no etcd CA: optional, as the
	// encryption configuration is.
	shared = slices.DeleteFunc(shared, func(s string) bool { return strings.Contains(s, EtcdCA) })

	check := func(t *testing.T, b Bundle, want []string) {
		t.Helper()
		dst := datadir.New(t.TempDir())
		if err := b.Install(dst); err != nil {
			t.Fatalf("Install: %v", err)
		}
		got := tree(t, dst.Root)
		for p, mode := range got {
			switch {
			case mode.IsDir():
				if mode.Perm() != 0o700 {
					t.Errorf("directory %s has mode %v, want 0700", p, mode.Perm())
				}
			case !slices.Contains(want, p):
				t.Errorf("Install wrote %s, not a shared file of the source", p)
			case mode.Perm() != 0o600:
				t.Errorf("%s has mode %v, want 0600", p, mode.Perm())
			}
		}
		for _, rel := range want {
			have, err := os.ReadFile(filepath.Join(dst.Root, rel))
			if err != nil {
				t.Errorf("Install did not write %s: %v", rel, err)
				continue
			}
			orig, err := os.ReadFile(filepath.Join(src.Root, rel))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(have, orig) {
				t.Errorf("%s differs from the source's", rel)
			}
		}
		if !b.Same(dst) {
			t.Errorf("Same is false on the data dir just installed")
		}
	}

	t.Run("without encryption", func(t *testing.T) {
		b, err := Collect(src, testSettings)
		if err != nil {
			t.Fatal(err)
		}
		want := slices.DeleteFunc(slices.Clone(shared), func(s string) bool { return s == "server/cred/encryption-config.yaml" })
		if got := slices.Sorted(maps.Keys(b.Files)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			t.Errorf("Collect took %v, want %v", got, want)
		}
		if b.Encrypted(src) || !maps.Equal(b.Settings, testSettings) {
			t.Errorf("Encrypted %v, Settings %v", b.Encrypted(src), b.Settings)
		}
		check(t, b, want)
		if b.Same(datadir.New(t.TempDir())) {
			t.Errorf("Same is true on an empty data dir")
		}
	})

	t.Run("with encryption", func(t *testing.T) {
		src := cluster(t)
		addEncryption(t, src)
		b, err := Collect(src, testSettings)
		if err != nil {
			t.Fatal(err)
		}
		if !b.Encrypted(src) || len(b.Files) != len(shared) {
			t.Errorf("Encrypted %v with files %v", b.Encrypted(src), slices.Sorted(maps.Keys(b.Files)))
		}
		// Checked against this source.
		dst := datadir.New(t.TempDir())
		if err := b.Install(dst); err != nil {
			t.Fatal(err)
		}
		for _, rel := range shared {
			have, err1 := os.ReadFile(filepath.Join(dst.Root, rel))
			orig, err2 := os.ReadFile(filepath.Join(src.Root, rel))
			if err1 != nil || err2 != nil || !bytes.Equal(have, orig) {
				t.Errorf("%s: not installed alike (%v, %v)", rel, err1, err2)
			}
		}
		if m := tree(t, dst.Root); m["server/cred"].Perm() != 0o700 || m["server/cred/encryption-config.yaml"].Perm() != 0o600 {
			t.Errorf("modes: cred %v, encryption config %v", m["server/cred"].Perm(), m["server/cred/encryption-config.yaml"].Perm())
		}
	})

	t.Run("a CA missing", func(t *testing.T) {
		l := cluster(t)
		if err := os.Remove(l.TLS("client-ca.key")); err != nil {
			t.Fatal(err)
		}
		if _, err := Collect(l, nil); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Collect without client-ca.key: %v", err)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		good, err := Collect(src, testSettings)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name, path, want string
			drop             bool
		}{
			{"outside the data dir", "../../etc/passwd", "not a file servers share", false},
			{"absolute", "/etc/passwd", "not a file servers share", false},
			{"the SQLite file", "server/db/state.db", "not a file servers share", false},
			{"a leaf", "server/tls/serving-kube-apiserver.key", "not a file servers share", false},
			{"lacking a CA key", "server/tls/server-ca.key", "lacks server/tls/server-ca.key", true},
		} {
			t.Run(c.name, func(t *testing.T) {
				b := Bundle{Files: maps.Clone(good.Files), Settings: good.Settings}
				if c.drop {
					delete(b.Files, c.path)
				} else {
					b.Files[c.path] = []byte("root::0:0::/root:/bin/sh\n")
				}
				// The data dir two levels down: "../../etc/passwd" would
				// land in the test's own directory.
				top := t.TempDir()
				dst := datadir.New(filepath.Join(top, "a", "b"))
				if err := os.MkdirAll(dst.Root, 0o700); err != nil {
					t.Fatal(err)
				}
				err := b.Install(dst)
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("Install: %v, want an error with %q", err, c.want)
				}
				if got := slices.Sorted(maps.Keys(tree(t, top))); !slices.Equal(got, []string{"a", "a/b"}) {
					t.Errorf("Install of a refused record wrote %v", got)
				}
			})
		}
	})
}

func TestCheckSettings(t *testing.T) {
	b := Bundle{Settings: testSettings}
	if err := CheckSettings(b, maps.Clone(testSettings)); err != nil {
		t.Errorf("same settings: %v", err)
	}
	// A setting the cluster's record lacks, or the server does not give,
	// is not compared.
	if err := CheckSettings(b, map[string]string{"other": "x", "cluster-dns": "10.43.0.10"}); err != nil {
		t.Errorf("a subset: %v", err)
	}
	mine := maps.Clone(testSettings)
	mine["cluster-cidr"], mine["service-cidr"] = "10.98.0.0/16", "10.99.0.0/16"
	err := CheckSettings(b, mine)
	var fe *datastore.FieldError
	if !errors.As(err, &fe) || fe.Flag != "cluster-cidr" {
		t.Fatalf("two differences: %v", err)
	}
	for _, s := range []string{`--cluster-cidr "10.98.0.0/16"`, `"10.42.0.0/16"`, `--service-cidr "10.99.0.0/16"`, "--service-cidr=10.43.0.0/16"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q lacks %q", err, s)
		}
	}
}

// joinEnv is one cluster with a record sealed for tok, not expired.
type joinEnv struct {
	src  datadir.Layout
	tok  joinv1.Token
	rec  []byte
	now  time.Time
	mine map[string]string
}

func newJoinEnv(t *testing.T) joinEnv {
	e := joinEnv{src: cluster(t), now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	e.tok = tokenOfCluster(t, e.src, "abcdef", "0123456789abcdef")
	b, err := Collect(e.src, testSettings)
	if err != nil {
		t.Fatal(err)
	}
	exp := e.now.Add(time.Hour)
	b.Expires = &exp
	if e.rec, err = Seal(b, e.tok); err != nil {
		t.Fatal(err)
	}
	e.mine = maps.Clone(testSettings)
	e.mine[FlagSecretsEncryption] = "false"
	return e
}

func (e joinEnv) store() *memStore {
	s := newMemStore()
	s.recs[e.tok.ID] = e.rec
	return s
}

// refused checks that err is a FieldError on flag holding every want,
// without the token's secret, and that nothing was written to l.
func refused(t *testing.T, err error, l datadir.Layout, flag string, want ...string) {
	t.Helper()
	var fe *datastore.FieldError
	if !errors.As(err, &fe) || fe.Flag != flag {
		t.Fatalf("got %v, want an error on --%s", err, flag)
	}
	for _, s := range append(want, "--"+flag, "nothing was started") {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q lacks %q", err, s)
		}
	}
	if strings.Contains(err.Error(), "0123456789abcdef") {
		t.Errorf("%q shows the token's secret", err)
	}
	empty(t, l)
}

func TestJoin(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	ctx := context.Background()

	t.Run("success", func(t *testing.T) {
		t.Parallel()
		dst := datadir.New(t.TempDir())
		called := false
		if err := Join(ctx, e.store(), e.tok, dst, e.mine, e.now, time.Minute, func(error) { called = true }); err != nil {
			t.Fatalf("Join: %v", err)
		}
		if called {
			t.Errorf("progress called though the record was there")
		}
		for _, rel := range SharedFiles(e.src) {
			have, err1 := os.ReadFile(filepath.Join(dst.Root, rel))
			orig, err2 := os.ReadFile(filepath.Join(e.src.Root, rel))
			if errors.Is(err2, os.ErrNotExist) {
				if err1 == nil {
					t.Errorf("%s written, the cluster has none", rel)
				}
				continue
			}
			if err1 != nil || !bytes.Equal(have, orig) {
				t.Errorf("%s: not the cluster's (%v)", rel, err1)
			}
		}
	})

	t.Run("no record", func(t *testing.T) {
		t.Parallel()
		dst := datadir.New(t.TempDir())
		var progress []error
		start := time.Now()
		err := Join(ctx, newMemStore(), e.tok, dst, e.mine, e.now, 1500*time.Millisecond, func(err error) { progress = append(progress, err) })
		if d := time.Since(start); d < 1500*time.Millisecond || d > 10*time.Second {
			t.Errorf("gave up after %s, want the 1.5s wait", d)
		}
		refused(t, err, dst, FlagToken, "no server of the cluster in this datastore knows the token", "k3sm token create", "::abcdef.")
		if len(progress) == 0 || !strings.Contains(progress[0].Error(), "no bootstrap record of token abcdef") {
			t.Errorf("progress while waiting: %v", progress)
		}
	})

	t.Run("context ended", func(t *testing.T) {
		t.Parallel()
		dst := datadir.New(t.TempDir())
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		start := time.Now()
		err := Join(cctx, newMemStore(), e.tok, dst, e.mine, e.now, time.Minute, nil)
		if time.Since(start) > 5*time.Second {
			t.Errorf("waited %s after the context ended", time.Since(start))
		}
		refused(t, err, dst, FlagToken, "knows the token")
	})

	t.Run("wrong secret", func(t *testing.T) {
		t.Parallel()
		dst := datadir.New(t.TempDir())
		tok := e.tok
		tok.Secret = "fedcba9876543210"
		err := Join(ctx, e.store(), tok, dst, e.mine, e.now, time.Minute, nil)
		refused(t, err, dst, FlagToken, ErrWrongToken.Error())
		if strings.Contains(err.Error(), tok.Secret) {
			t.Errorf("%q shows the secret given", err)
		}
	})

	t.Run("another CA", func(t *testing.T) {
		t.Parallel()
		dst := datadir.New(t.TempDir())
		other := cluster(t)
		tok := tokenOfCluster(t, other, e.tok.ID, e.tok.Secret)
		err := Join(ctx, e.store(), tok, dst, e.mine, e.now, time.Minute, nil)
		refused(t, err, dst, FlagToken, "another CA")
	})

	t.Run("expired", func(t *testing.T) {
		t.Parallel()
		dst := datadir.New(t.TempDir())
		err := Join(ctx, e.store(), e.tok, dst, e.mine, e.now.Add(2*time.Hour), time.Minute, nil)
		refused(t, err, dst, FlagToken, "expired", e.now.Add(time.Hour).Format(time.RFC3339))
	})

	t.Run("settings differ", func(t *testing.T) {
		t.Parallel()
		dst := datadir.New(t.TempDir())
		mine := maps.Clone(e.mine)
		mine["service-cidr"] = "10.99.0.0/16"
		err := Join(ctx, e.store(), e.tok, dst, mine, e.now, time.Minute, nil)
		var fe *datastore.FieldError
		if !errors.As(err, &fe) || fe.Flag != "service-cidr" {
			t.Fatalf("got %v, want an error on --service-cidr", err)
		}
		for _, s := range []string{"--service-cidr", "10.99.0.0/16", `the cluster's servers run with "10.43.0.0/16"`, "nothing was started"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%q lacks %q", err, s)
			}
		}
		empty(t, dst)
	})

	t.Run("secrets encryption on a cluster without", func(t *testing.T) {
		t.Parallel()
		dst := datadir.New(t.TempDir())
		mine := maps.Clone(e.mine)
		mine[FlagSecretsEncryption] = "true"
		err := Join(ctx, e.store(), e.tok, dst, mine, e.now, time.Minute, nil)
		refused(t, err, dst, FlagSecretsEncryption, "created without it")
	})

	// The record is written while the joining server waits (`k3sm token
	// create` just ran); this cluster encrypts Secrets, so
	// --secrets-encryption is welcome and the keys are installed.
	t.Run("record appears while waiting", func(t *testing.T) {
		t.Parallel()
		src := cluster(t)
		cfg := addEncryption(t, src)
		tok := tokenOfCluster(t, src, "zyx987", "abcdefghij012345")
		b, err := Collect(src, testSettings)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := Seal(b, tok)
		if err != nil {
			t.Fatal(err)
		}
		store := newMemStore()
		var mu sync.Mutex
		var progress []error
		go func() {
			time.Sleep(300 * time.Millisecond)
			_ = store.Put(ctx, tok.ID, rec)
		}()
		dst := datadir.New(t.TempDir())
		mine := maps.Clone(e.mine)
		mine[FlagSecretsEncryption] = "true"
		err = Join(ctx, store, tok, dst, mine, e.now, 30*time.Second, func(err error) {
			mu.Lock()
			defer mu.Unlock()
			progress = append(progress, err)
		})
		if err != nil {
			t.Fatalf("Join: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(progress) == 0 {
			t.Errorf("progress not called while waiting")
		}
		if have, err := os.ReadFile(dst.EncryptionConfig()); err != nil || !bytes.Equal(have, cfg) {
			t.Errorf("encryption config not installed: %v", err)
		}
		if !b.Same(dst) {
			t.Errorf("the data dir does not hold the record's files")
		}
	})
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func tokenSecret(id, secret string, expires *time.Time) *corev1.Secret {
	return tokenSecretIn(metav1.NamespaceSystem, id, secret, expires)
}

func tokenSecretIn(ns, id, secret string, expires *time.Time) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapapi.BootstrapTokenSecretPrefix + id, Namespace: ns},
		Type:       bootstrapapi.SecretTypeBootstrapToken,
		Data: map[string][]byte{
			bootstrapapi.BootstrapTokenIDKey:               []byte(id),
			bootstrapapi.BootstrapTokenSecretKey:           []byte(secret),
			bootstrapapi.BootstrapTokenUsageAuthentication: []byte("true"),
		},
	}
	if expires != nil {
		s.Data[bootstrapapi.BootstrapTokenExpirationKey] = []byte(expires.UTC().Format(time.RFC3339))
	}
	return s
}

func TestSync(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := cluster(t)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	clock := now
	store := newMemStore()
	// A record of a token deleted while no server ran.
	store.recs["gone00"] = []byte("stale")
	newSyncer := func() *Syncer {
		return &Syncer{Store: store, Layout: l, Settings: testSettings, Log: discard(), Now: func() time.Time { return clock }}
	}
	s := newSyncer()

	a := joinv1.Token{ID: "aaaaaa", Secret: "aaaaaaaaaaaaaaa1"}
	b := joinv1.Token{ID: "bbbbbb", Secret: "bbbbbbbbbbbbbbb2"}
	bExp := now.Add(time.Hour)
	past := now.Add(-time.Minute)
	notToken := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "opaque", Namespace: metav1.NamespaceSystem},
		Type: corev1.SecretTypeOpaque, Data: map[string][]byte{bootstrapapi.BootstrapTokenIDKey: []byte("oooooo"), bootstrapapi.BootstrapTokenSecretKey: []byte("oooooooooooooooo")}}
	badExp := tokenSecret("dddddd", "dddddddddddddddd", nil)
	badExp.Data[bootstrapapi.BootstrapTokenExpirationKey] = []byte("tomorrow")
	secrets := []*corev1.Secret{
		tokenSecret(a.ID, a.Secret, nil),
		tokenSecret(b.ID, b.Secret, &bExp),
		tokenSecret("cccccc", "cccccccccccccccc", &past), // expired
		tokenSecret("eeeeee", "short", nil),              // malformed
		badExp,
		notToken,
	}
	ids := func() []string {
		got, _ := store.List(ctx)
		return got
	}

	if err := s.Sync(ctx, secrets); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if got := ids(); !slices.Equal(got, []string{a.ID, b.ID}) {
		t.Fatalf("records %v, want those of the two valid tokens", got)
	}
	if n := store.putCount(); n != 2 {
		t.Errorf("%d Puts, want 2", n)
	}
	want, err := Collect(l, testSettings)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tok joinv1.Token
		exp *time.Time
	}{{a, nil}, {b, &bExp}} {
		rec, _, _ := store.Get(ctx, c.tok.ID)
		got, err := Open(rec, c.tok)
		if err != nil {
			t.Fatalf("the record of %s does not open with its token: %v", c.tok.ID, err)
		}
		if !maps.EqualFunc(got.Files, want.Files, bytes.Equal) || !maps.Equal(got.Settings, testSettings) {
			t.Errorf("the record of %s holds files %v, settings %v", c.tok.ID, slices.Sorted(maps.Keys(got.Files)), got.Settings)
		}
		if (got.Expires == nil) != (c.exp == nil) || (c.exp != nil && !got.Expires.Equal(*c.exp)) {
			t.Errorf("the record of %s expires %v, want %v", c.tok.ID, got.Expires, c.exp)
		}
	}

	// Nothing changed: nothing written.
	if err := s.Sync(ctx, secrets); err != nil {
		t.Fatal(err)
	}
	if n := store.putCount(); n != 2 {
		t.Errorf("an unchanged sync wrote: %d Puts, want 2", n)
	}
	// Nor by another server (or this one restarted), which finds the
	// records it would write.
	if err := newSyncer().Sync(ctx, secrets); err != nil {
		t.Fatal(err)
	}
	if n := store.putCount(); n != 2 {
		t.Errorf("a second server's sync rewrote the same records: %d Puts, want 2", n)
	}

	// A record removed by hand is written again by the next sync.
	_ = store.Delete(ctx, a.ID)
	if err := s.Sync(ctx, secrets); err != nil {
		t.Fatal(err)
	}
	if got := ids(); !slices.Equal(got, []string{a.ID, b.ID}) {
		t.Errorf("after removing %s's record by hand and a sync: records %v", a.ID, got)
	}

	// A shared file changed (Secrets encryption turned on): rewritten.
	puts := store.putCount()
	addEncryption(t, l)
	if err := s.Sync(ctx, secrets); err != nil {
		t.Fatal(err)
	}
	if n := store.putCount() - puts; n != 2 {
		t.Errorf("after a shared file changed: %d Puts, want 2", n)
	}
	rec, _, _ := store.Get(ctx, a.ID)
	if got, err := Open(rec, a); err != nil || !got.Encrypted(l) {
		t.Errorf("the rewritten record: encrypted %v, %v", got.Encrypted(l), err)
	}

	// b expires: its record goes.
	clock = bExp.Add(time.Second)
	if err := s.Sync(ctx, secrets); err != nil {
		t.Fatal(err)
	}
	if got := ids(); !slices.Equal(got, []string{a.ID}) {
		t.Errorf("after %s expired: records %v", b.ID, got)
	}
	// a is deleted: its record goes.
	if err := s.Sync(ctx, secrets[1:]); err != nil {
		t.Fatal(err)
	}
	if got := ids(); len(got) != 0 {
		t.Errorf("after every token went: records %v", got)
	}
}

func TestSyncCollectFails(t *testing.T) {
	l := datadir.New(t.TempDir())
	store := newMemStore()
	store.recs["aaaaaa"] = []byte("kept")
	s := &Syncer{Store: store, Layout: l, Log: discard()}
	if err := s.Sync(context.Background(), nil); err == nil {
		t.Errorf("Sync without the CAs succeeded")
	}
	// A server that cannot read its own files removes nothing.
	if _, ok, _ := store.Get(context.Background(), "aaaaaa"); !ok {
		t.Errorf("a record was removed by a failed sync")
	}
}

// TestSyncerRun: the syncer follows the token Secrets of a cluster
// (k8s.io/client-go's fake, which ignores Run's field selector: Sync
// itself skips Secrets of other types).
func TestSyncerRun(t *testing.T) {
	t.Parallel()
	l := cluster(t)
	store := newMemStore()
	client := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: metav1.NamespaceSystem},
		Type: corev1.SecretTypeOpaque})
	s := &Syncer{Client: client, Store: store, Layout: l, Settings: testSettings, Log: discard(), Every: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after its context ended")
		}
	})

	tok := joinv1.Token{ID: "abcdef", Secret: "0123456789abcdef"}
	exp := time.Now().Add(time.Hour)
	if _, err := client.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, tokenSecret(tok.ID, tok.Secret, &exp), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// In another namespace a Secret of the type is no token.
	if _, err := client.CoreV1().Secrets("default").Create(ctx, tokenSecretIn("default", "zzzzzz", "zzzzzzzzzzzzzzzz", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the token's record", func() bool {
		_, ok, _ := store.Get(ctx, tok.ID)
		return ok
	})
	rec, _, _ := store.Get(ctx, tok.ID)
	if b, err := Open(rec, tok); err != nil || !maps.Equal(b.Settings, testSettings) {
		t.Errorf("the record written by Run: %+v, %v", b.Settings, err)
	}
	if ids, _ := store.List(ctx); !slices.Equal(ids, []string{tok.ID}) {
		t.Errorf("records %v, want only %s's", ids, tok.ID)
	}

	if err := client.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, bootstrapapi.BootstrapTokenSecretPrefix+tok.ID, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the deleted token's record to go", func() bool {
		ids, _ := store.List(ctx)
		return len(ids) == 0
	})
}
