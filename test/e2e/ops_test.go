package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/server/certs"
	"github.com/k3sm-dev/k3sm/internal/server/encryption"
	"github.com/k3sm-dev/k3sm/internal/server/kinedb"
	"github.com/k3sm-dev/k3sm/internal/server/snapshot"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// k3sm runs a k3sm command and returns its combined output.
func k3sm(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(c, k3smBin, args...).CombinedOutput()
	return string(out), err
}

func mustK3sm(t *testing.T, timeout time.Duration, args ...string) string {
	t.Helper()
	out, err := k3sm(t, timeout, args...)
	if err != nil {
		t.Fatalf("k3sm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func snapshots(t *testing.T, dataDir string) []snapshot.Metadata {
	t.Helper()
	var list []snapshot.Metadata
	out := mustK3sm(t, time.Minute, "snapshot", "ls", "--data-dir", dataDir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("snapshot ls -o json: %v\n%s", err, out)
	}
	return list
}

func countPrefix(list []snapshot.Metadata, prefix string) int {
	n := 0
	for _, m := range list {
		if m.Prefix == prefix {
			n++
		}
	}
	return n
}

func (s *server) mkConfigMap(t *testing.T, name string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": name}}
	if _, err := s.client().CoreV1().ConfigMaps("default").Create(ctx(t), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotRestore: a snapshot taken while the server runs, restored
// with the server stopped, brings back what existed before it and nothing
// made after it; the schedule keeps its retention; a restore beside a
// running server or from another cluster is refused.
func TestSnapshotRestore(t *testing.T) {
	s := newServer(t, "--snapshot-schedule", "2s", "--snapshot-retention", "2")
	s.start()
	s.mkConfigMap(t, "before-snapshot")
	out := mustK3sm(t, time.Minute, "snapshot", "save", "--data-dir", s.dataDir, "--name", "manual")
	m := regexp.MustCompile(`saved snapshot (\S+) in`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("save said: %s", out)
	}
	name := m[1]
	s.mkConfigMap(t, "after-snapshot")

	if out, err := k3sm(t, time.Minute, "snapshot", "restore", name, "--data-dir", s.dataDir); err == nil ||
		!strings.Contains(out, "another k3sm server") || !strings.Contains(out, "stop it first") {
		t.Fatalf("restore beside a running server: %v\n%s", err, out)
	}
	// The schedule saves every 2s and keeps 2.
	waitFor(t, time.Minute, "two scheduled snapshots", func() error {
		if n := countPrefix(snapshots(t, s.dataDir), snapshot.ScheduledPrefix); n != 2 {
			return fmt.Errorf("%d scheduled snapshots", n)
		}
		return nil
	})
	time.Sleep(5 * time.Second)
	list := snapshots(t, s.dataDir)
	if n := countPrefix(list, snapshot.ScheduledPrefix); n != 2 {
		t.Fatalf("--snapshot-retention 2: %d scheduled snapshots: %+v", n, list)
	}
	if !strings.Contains(s.output(), "snapshot saved") {
		t.Fatalf("the server does not log its scheduled snapshots:\n%s", s.output())
	}
	s.stop()

	// Another cluster's data dir refuses it unless --force.
	other := t.TempDir()
	if _, err := pki.LoadOrCreateCA(filepath.Join(other, "server", "tls"), "server-ca", "another-cluster"); err != nil {
		t.Fatal(err)
	}
	snapDir := filepath.Join(s.dataDir, "server", "snapshots")
	out, err := k3sm(t, time.Minute, "snapshot", "restore", name, "--data-dir", other, "--dir", snapDir)
	if err == nil || !strings.Contains(out, "another cluster") || !strings.Contains(out, "--force") {
		t.Fatalf("restore over another cluster: %v\n%s", err, out)
	}
	mustK3sm(t, time.Minute, "snapshot", "restore", name, "--data-dir", other, "--dir", snapDir, "--force")

	out = mustK3sm(t, time.Minute, "snapshot", "restore", name, "--data-dir", s.dataDir)
	if !strings.Contains(out, "restored snapshot "+name) || !strings.Contains(out, snapshot.PreRestorePrefix+"-") {
		t.Fatalf("restore said: %s", out)
	}
	// The flag on a cluster created without it: a warning, no encryption.
	s.extra = append(s.extra, "--secrets-encryption")
	s.start()
	cx := ctx(t)
	if _, err := s.client().CoreV1().ConfigMaps("default").Get(cx, "before-snapshot", metav1.GetOptions{}); err != nil {
		t.Fatalf("object from before the snapshot: %v", err)
	}
	if _, err := s.client().CoreV1().ConfigMaps("default").Get(cx, "after-snapshot", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("object from after the snapshot: want NotFound, got %v", err)
	}
	if !strings.Contains(s.output(), "takes effect only on the start that creates the cluster") {
		t.Fatalf("no warning for --secrets-encryption on an existing cluster:\n%s", s.output())
	}
	if countPrefix(snapshots(t, s.dataDir), snapshot.PreRestorePrefix) != 1 {
		t.Fatal("the state the restore replaced was not kept as a pre-restore snapshot")
	}
}

func rawSecret(t *testing.T, dataDir, ns, name string) []byte {
	t.Helper()
	db, err := kinedb.Open(filepath.Join(dataDir, "server", "db", "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	v, ok, err := db.Value(context.Background(), "/registry/secrets/"+ns+"/"+name)
	if err != nil || !ok {
		t.Fatalf("secret %s/%s in the datastore: ok=%v err=%v", ns, name, ok, err)
	}
	return v
}

func encStatus(t *testing.T, dataDir string) encryption.Status {
	t.Helper()
	var st encryption.Status
	out := mustK3sm(t, time.Minute, "secrets-encrypt", "status", "--data-dir", dataDir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	return st
}

// TestSecretsEncryption: Secrets of a cluster created with
// --secrets-encryption are not plaintext in the SQLite file, and
// rotate-keys moves every one to a new key while the server serves.
func TestSecretsEncryption(t *testing.T) {
	s := newServer(t, "--secrets-encryption")
	// The apiserver re-reads the configuration every 3 s, not every
	// minute: rotate-keys waits for two reloads.
	s.env = []string{"K3SM_ENCRYPTION_CONFIG_RELOAD=3s"}
	s.start()
	if !strings.Contains(s.output(), "secrets encryption at rest: on for this new cluster") {
		t.Fatalf("no log line for encryption:\n%s", s.output())
	}
	cfgFile := filepath.Join(s.dataDir, "server", "cred", "encryption-config.yaml")
	if st, err := os.Stat(cfgFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v", cfgFile, st, err)
	}
	c := s.client()
	mk := func(name string) {
		t.Helper()
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"token": "plaintext-marker-" + name}}
		if _, err := c.CoreV1().Secrets("default").Create(ctx(t), sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("before-rotation")
	for i := range 20 {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bulk-%d", i)}, StringData: map[string]string{"i": fmt.Sprint(i)}}
		if _, err := c.CoreV1().Secrets("kube-system").Create(ctx(t), sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	st := encStatus(t, s.dataDir)
	if !st.Enabled || len(st.Keys) != 1 {
		t.Fatalf("status %+v", st)
	}
	oldKey := st.ActiveKey
	raw := rawSecret(t, s.dataDir, "default", "before-rotation")
	if bytes.Contains(raw, []byte("plaintext-marker")) || !bytes.HasPrefix(raw, []byte(encryption.StoredPrefix(oldKey))) {
		t.Fatalf("stored secret is not encrypted with %s: %q", oldKey, raw[:min(len(raw), 80)])
	}
	if st.Secrets["identity"] != 0 {
		t.Fatalf("plaintext secrets in an encrypted cluster: %+v", st.Secrets)
	}

	out := mustK3sm(t, time.Minute, "snapshot", "save", "--data-dir", s.dataDir, "--name", "pre-rotation")
	snap := regexp.MustCompile(`saved snapshot (\S+) in`).FindStringSubmatch(out)
	if snap == nil {
		t.Fatalf("save said: %s", out)
	}

	// The API keeps serving during the rotation.
	stop := make(chan struct{})
	served := make(chan int, 1)
	go func() {
		n := 0
		defer func() { served <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			if got, err := c.CoreV1().Secrets("default").Get(context.Background(), "before-rotation", metav1.GetOptions{}); err == nil &&
				string(got.Data["token"]) == "plaintext-marker-before-rotation" {
				n++
			} else {
				t.Errorf("during the rotation: %v", err)
			}
		}
	}()
	start := time.Now()
	out = mustK3sm(t, 8*time.Minute, "secrets-encrypt", "rotate-keys", "--data-dir", s.dataDir)
	close(stop)
	t.Logf("rotate-keys took %s, %d reads during it:\n%s", time.Since(start).Round(time.Second), <-served, out)
	mk("after-rotation")

	st = encStatus(t, s.dataDir)
	newKey := st.ActiveKey
	if newKey == oldKey || len(st.Keys) != 1 || st.Keys[0] != newKey {
		t.Fatalf("after the rotation: %+v (old key %s)", st, oldKey)
	}
	if len(st.Secrets) != 1 || st.Secrets[newKey] < 22 {
		t.Fatalf("every Secret must be under %s: %+v", newKey, st.Secrets)
	}
	for _, name := range []string{"before-rotation", "after-rotation"} {
		raw := rawSecret(t, s.dataDir, "default", name)
		if !bytes.HasPrefix(raw, []byte(encryption.StoredPrefix(newKey))) || bytes.Contains(raw, []byte("plaintext-marker")) {
			t.Fatalf("%s is stored as %q, want the prefix %s", name, raw[:min(len(raw), 80)], encryption.StoredPrefix(newKey))
		}
		got, err := c.CoreV1().Secrets("default").Get(ctx(t), name, metav1.GetOptions{})
		if err != nil || string(got.Data["token"]) != "plaintext-marker-"+name {
			t.Fatalf("read back %s: %v %v", name, got, err)
		}
	}

	// A snapshot carries the keys its Secrets need: the one from before the
	// rotation restores the old key with the Secrets stored under it.
	s.stop()
	mustK3sm(t, time.Minute, "snapshot", "restore", snap[1], "--data-dir", s.dataDir)
	s.start()
	if st := encStatus(t, s.dataDir); st.ActiveKey != oldKey || st.Secrets[oldKey] < 21 {
		t.Fatalf("after restoring the pre-rotation snapshot: %+v, want key %s", st, oldKey)
	}
	got, err := s.client().CoreV1().Secrets("default").Get(ctx(t), "before-rotation", metav1.GetOptions{})
	if err != nil || string(got.Data["token"]) != "plaintext-marker-before-rotation" {
		t.Fatalf("restored secret: %v %v", got, err)
	}
	if _, err := s.client().CoreV1().Secrets("default").Get(ctx(t), "after-rotation", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a Secret made after the snapshot: want NotFound, got %v", err)
	}
}

func readCerts(t *testing.T, dataDir string) map[string]certs.Cert {
	t.Helper()
	var list []certs.Cert
	out := mustK3sm(t, time.Minute, "certificate", "check", "--data-dir", dataDir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("certificate check: %v\n%s", err, out)
	}
	m := map[string]certs.Cert{}
	for _, c := range list {
		m[c.Name] = c
	}
	return m
}

// TestAuditLogAndCertificates: --audit-log records requests (metadata
// only); `certificate check` lists every certificate; `certificate rotate`
// re-issues leaves of a stopped server, which serves them when it starts.
func TestAuditLogAndCertificates(t *testing.T) {
	s := newServer(t, "--audit-log")
	s.start()
	c := s.client()
	s.mkConfigMap(t, "audit-probe")
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "audit-secret"}, StringData: map[string]string{"k": "audit-body-marker"}}
	if _, err := c.CoreV1().Secrets("default").Create(ctx(t), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(s.dataDir, "logs", "audit.log")
	waitFor(t, time.Minute, "the requests in the audit log", func() error {
		data, err := os.ReadFile(logFile)
		if err != nil {
			return err
		}
		if !bytes.Contains(data, []byte(`"name":"audit-probe"`)) || !bytes.Contains(data, []byte(`"name":"audit-secret"`)) {
			return fmt.Errorf("%s has no events for audit-probe and audit-secret yet", logFile)
		}
		return nil
	})
	data, _ := os.ReadFile(logFile)
	if bytes.Contains(data, []byte("audit-body-marker")) {
		t.Fatal("the audit log holds a Secret's data")
	}
	found := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev struct {
			Level     string                          `json:"level"`
			Verb      string                          `json:"verb"`
			User      struct{ Username string }       `json:"user"`
			ObjectRef struct{ Resource, Name string } `json:"objectRef"`
			Request   json.RawMessage                 `json:"requestObject"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			t.Fatalf("not an audit event: %s", sc.Text())
		}
		if ev.ObjectRef.Name == "audit-secret" && ev.Verb == "create" {
			found = true
			if ev.Level != "Metadata" || ev.Request != nil || ev.User.Username != "system:admin" {
				t.Fatalf("secret create event: %s", sc.Text())
			}
		}
	}
	if !found {
		t.Fatal("no create event for the secret")
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "server", "audit-policy.yaml")); err != nil {
		t.Fatal(err)
	}

	// Certificates.
	before := readCerts(t, s.dataDir)
	for _, name := range []string{"server-ca", "client-ca", "request-header-ca", "serving-kube-apiserver", "client-admin",
		"serving-kube-scheduler", "agent/serving-kubelet", "agent/client-kubelet"} {
		c, ok := before[name]
		if !ok {
			t.Fatalf("certificate check misses %s: %v", name, before)
		}
		if c.Status != "ok" || c.NotAfter.Before(time.Now().Add(300*24*time.Hour)) {
			t.Fatalf("%s: %+v", name, c)
		}
	}
	if out, err := k3sm(t, time.Minute, "certificate", "rotate", "--data-dir", s.dataDir); err == nil || !strings.Contains(out, "stop it") {
		t.Fatalf("rotate beside a running server: %v\n%s", err, out)
	}
	s.stop()
	time.Sleep(1100 * time.Millisecond) // new certificates start a second later at least
	out := mustK3sm(t, time.Minute, "certificate", "rotate", "--data-dir", s.dataDir, "--service", "kube-apiserver", "--service", "admin")
	if !strings.Contains(out, "re-issued serving-kube-apiserver") || !strings.Contains(out, "re-issued client-admin") || !strings.Contains(out, "admin.kubeconfig") {
		t.Fatalf("rotate said: %s", out)
	}
	after := readCerts(t, s.dataDir)
	for name, b := range before {
		a := after[name]
		rotated := name == "serving-kube-apiserver" || name == "client-kube-apiserver" || name == "client-auth-proxy" || name == "client-admin"
		if rotated != !a.NotBefore.Equal(b.NotBefore) {
			t.Errorf("%s: rotated %v, notBefore %s -> %s", name, rotated, b.NotBefore, a.NotBefore)
		}
	}
	s.start()
	// The apiserver serves the new certificate, and the updated admin.kubeconfig works.
	conn, err := tls.Dial("tcp", s.restConfig().Host[len("https://"):], &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	served := conn.ConnectionState().PeerCertificates[0]
	conn.Close()
	if !served.NotBefore.Equal(after["serving-kube-apiserver"].NotBefore) {
		t.Fatalf("the apiserver serves a certificate from %s, want the re-issued one from %s", served.NotBefore, after["serving-kube-apiserver"].NotBefore)
	}
	if _, err := s.client().CoreV1().ConfigMaps("default").Get(ctx(t), "audit-probe", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestOpsWithoutCluster: every operations command says when no cluster is
// there, by --data-dir or $K3SM_DATA_DIR, and bad server flags name themselves.
func TestOpsWithoutCluster(t *testing.T) {
	empty := t.TempDir()
	for _, args := range [][]string{
		{"snapshot", "save"}, {"snapshot", "ls"}, {"snapshot", "restore", "x"},
		{"secrets-encrypt", "status"}, {"secrets-encrypt", "rotate-keys"},
		{"certificate", "check"}, {"certificate", "rotate"},
	} {
		for _, env := range []bool{false, true} {
			cmd := exec.Command(k3smBin, args...)
			if env {
				cmd.Env = append(os.Environ(), "K3SM_DATA_DIR="+empty)
			} else {
				cmd.Args = append(cmd.Args, "--data-dir", empty)
			}
			out, err := cmd.CombinedOutput()
			if err == nil || (!strings.Contains(string(out), "no k3sm cluster at "+empty) && !strings.Contains(string(out), "no snapshot")) {
				t.Errorf("k3sm %v (env %v): %v\n%s", args, env, err, out)
			}
		}
	}
	for _, tc := range []struct{ flag, value string }{{"--snapshot-schedule", "-1h"}, {"--snapshot-retention", "0"}} {
		out, err := k3sm(t, time.Minute, "server", "--data-dir", t.TempDir(), tc.flag, tc.value)
		if err == nil || !strings.Contains(out, tc.flag) {
			t.Errorf("server %s %s: %v\n%s", tc.flag, tc.value, err, out)
		}
	}
}
