package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"k8s.io/client-go/tools/clientcmd"
)

func cluster(t *testing.T) (*controlplane.Config, datadir.Layout) {
	t.Helper()
	cfg := controlplane.Defaults()
	cfg.DataDir = t.TempDir()
	cfg.BindAddress, cfg.AdvertiseAddress = "127.0.0.1", "127.0.0.1"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := controlplane.EnsurePKI(&cfg); err != nil {
		t.Fatal(err)
	}
	return &cfg, datadir.New(cfg.DataDir)
}

func find(t *testing.T, list []Cert, name string) Cert {
	t.Helper()
	for _, c := range list {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no %s in %v", name, list)
	return Cert{}
}

func TestCheckAndRotate(t *testing.T) {
	cfg, l := cluster(t)
	list, err := Check(cfg.DataDir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !list[0].CA || list[0].DaysLeft < 3000 {
		t.Fatalf("CAs first, 10 years: %+v", list[0])
	}
	admin := find(t, list, "client-admin")
	if admin.CA || admin.Service != "admin" || admin.Status != "ok" || admin.DaysLeft < 360 {
		t.Fatalf("admin leaf %+v", admin)
	}
	before, _ := os.ReadFile(l.AdminKubeconfig())
	if _, _, err := Rotate(cfg.DataDir, []string{"nope"}); err == nil || !strings.Contains(err.Error(), "kube-apiserver") {
		t.Fatalf("unknown service: %v", err)
	}
	done, kubeconfigs, err := Rotate(cfg.DataDir, []string{"admin"})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 1 || done[0].Name != "client-admin" || len(kubeconfigs) != 2 {
		t.Fatalf("rotated %v, kubeconfigs %v", done, kubeconfigs)
	}
	after, _ := os.ReadFile(l.AdminKubeconfig())
	if string(before) == string(after) {
		t.Fatal("admin.kubeconfig still embeds the old certificate")
	}
	kc, err := clientcmd.Load(after)
	if err != nil {
		t.Fatal(err)
	}
	crt, _ := os.ReadFile(l.TLS("client-admin.crt"))
	if string(kc.AuthInfos["k3sm-admin"].ClientCertificateData) != string(crt) {
		t.Fatal("admin.kubeconfig does not embed the new certificate")
	}
	// The next start keeps the re-issued leaf: same names and usages.
	if _, err := controlplane.EnsurePKI(cfg); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(l.TLS("client-admin.crt")); string(again) != string(crt) {
		t.Fatal("the server's start re-issued a rotated leaf")
	}
	// Every leaf, without --service.
	all, _, err := Rotate(cfg.DataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 6 { // EnsurePKI's leaves; the node's and health endpoints' are issued elsewhere
		t.Fatalf("rotated %d leaves, want every one", len(all))
	}
}

// A leaf within pki.RenewBefore of expiry is re-issued when the server starts.
func TestStartRenewsLeavesNearExpiry(t *testing.T) {
	cfg, l := cluster(t)
	ca, err := pki.LoadOrCreateCA(l.TLSDir(), "client-ca", "x")
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := ca.SignPublicKey(pki.LeafSpec{CommonName: controlplane.AdminUser, Organization: []string{"system:masters"}, Client: true},
		key.Public(), 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	os.WriteFile(l.TLS("client-admin.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	os.WriteFile(l.TLS("client-admin.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	list, _ := Check(cfg.DataDir, time.Now())
	if c := find(t, list, "client-admin"); c.Status != "renew" || c.DaysLeft > 30 {
		t.Fatalf("a leaf 30 days from expiry: %+v", c)
	}
	if _, err := controlplane.EnsurePKI(cfg); err != nil {
		t.Fatal(err)
	}
	list, _ = Check(cfg.DataDir, time.Now())
	if c := find(t, list, "client-admin"); c.Status != "ok" || c.DaysLeft < 360 {
		t.Fatalf("not renewed at start: %+v", c)
	}
	if _, err := Check(t.TempDir(), time.Now()); err == nil || !strings.Contains(err.Error(), "no k3sm cluster") {
		t.Fatalf("empty data dir: %v", err)
	}
}
