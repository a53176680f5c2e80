package k3smcmd

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
)

func TestAuditLogPathNeedsEquals(t *testing.T) {
	root := New(Upstream{}, nil)
	root.SetArgs([]string{"server", "--data-dir", t.TempDir(), "--audit-log", "/var/log/audit.log"})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "--audit-log=/var/log/audit.log") {
		t.Fatalf("want a hint to use --audit-log=PATH, got %v", err)
	}
}

func TestCertificateRotateNamesTheService(t *testing.T) {
	root := New(Upstream{}, nil)
	root.SetArgs([]string{"certificate", "rotate", "--data-dir", t.TempDir(), "--service", "bogus"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "no k3sm cluster") {
		t.Fatalf("empty data dir: %v", err)
	}
}

func TestWatchCertificatesWarns(t *testing.T) {
	cfg := controlplane.Defaults()
	cfg.DataDir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c, err := controlplane.EnsurePKI(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := c.ClientCA.SignPublicKey(pki.LeafSpec{CommonName: "x", Client: true}, key.Public(), 10*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l := datadir.New(cfg.DataDir)
	if err := pki.WriteFile(l.TLS("client-admin.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // one round
	watchCertificates(ctx, cfg.DataDir, slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	if out := buf.String(); !strings.Contains(out, "certificate=client-admin") || !strings.Contains(out, "status=renew") || strings.Contains(out, "serving-kube-apiserver") {
		t.Fatalf("log: %s", out)
	}
}
