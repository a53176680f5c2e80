package join

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	agentjoin "github.com/k3sm-dev/k3sm/internal/agent/join"
	"github.com/k3sm-dev/k3sm/internal/agent/localpath"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/pki"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/clientcmd"
)

type fixture struct {
	cs       *fake.Clientset
	e        *Endpoint
	url      string
	caPEM    []byte
	now      time.Time
	serverCA *pki.CA
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	serverCA, err := pki.LoadOrCreateCA(dir, "server-ca", "test-server-ca")
	if err != nil {
		t.Fatal(err)
	}
	clientCA, err := pki.LoadOrCreateCA(dir, "client-ca", "test-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := serverCA.Ensure(dir, "serving", pki.LeafSpec{CommonName: "kube-apiserver", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(leaf.CertPath, leaf.KeyPath)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{cs: fake.NewClientset(), caPEM: serverCA.CertPEM(), now: time.Now(), serverCA: serverCA}
	f.e = &Endpoint{Client: f.cs, ServerCA: serverCA, ClientCA: clientCA, Now: func() time.Time { return f.now }, Log: slog.New(slog.DiscardHandler),
		Settings: joinv1.ClusterSettings{Servers: []string{"https://127.0.0.1:6443"}, ClusterCIDR: "100.64.0.0/10",
			ServiceCIDR: "10.43.0.0/16", ClusterDNS: "10.43.0.10", ClusterDomain: "cluster.local"}}
	srv := httptest.NewUnstartedServer(f.e.Handler())
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *fixture) token(t *testing.T, ttl time.Duration) joinv1.Token {
	t.Helper()
	tok, err := CreateToken(context.Background(), f.cs, f.caPEM, ttl, "test", f.now)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (f *fixture) join(dir, node string, tok joinv1.Token) error {
	_, err := agentjoin.Join(context.Background(), agentjoin.Options{Server: f.url, Token: tok, NodeName: node, DataDir: dir,
		NodeIPs: []net.IP{net.ParseIP("10.0.0.2")}, Timeout: 10 * time.Second})
	return err
}

// files lists what a data dir holds.
func files(t *testing.T, dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

func TestJoin(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, time.Hour)
	dir := t.TempDir()
	if err := f.join(dir, "agent-1", tok); err != nil {
		t.Fatal(err)
	}
	l := datadir.New(dir)
	// The kubeconfig is the node's identity, from the cluster's client CA.
	cfg, err := clientcmd.LoadFromFile(l.NodeKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		b, _ := pem.Decode(ai.ClientCertificateData)
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if cert.Subject.CommonName != "system:node:agent-1" || strings.Join(cert.Subject.Organization, ",") != "system:nodes" {
			t.Errorf("client certificate subject %v", cert.Subject)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: poolOf(f.e.ClientCA.CertPEM()), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("client certificate: %v", err)
		}
	}
	if _, err := tls.LoadX509KeyPair(l.KubeletServingCert(), l.KubeletServingKey()); err != nil {
		t.Errorf("serving pair: %v", err)
	}
	// The local-path provisioner's kubeconfig: its own identity, no group.
	lp, err := clientcmd.LoadFromFile(l.LocalPathKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range lp.AuthInfos {
		data := ai.ClientCertificateData
		if len(data) == 0 {
			data, _ = os.ReadFile(ai.ClientCertificate)
		}
		b, _ := pem.Decode(data)
		if b == nil {
			t.Fatalf("local-path kubeconfig: no client certificate (%+v)", ai)
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if cert.Subject.CommonName != "k3sm:local-path-provisioner:agent-1" || len(cert.Subject.Organization) != 0 {
			t.Errorf("local-path certificate subject %v", cert.Subject)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: poolOf(f.e.ClientCA.CertPEM()), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("local-path certificate: %v", err)
		}
	}
	for _, p := range []string{l.NodePasswordFile(), l.NodeClientKey(), l.KubeletServingKey(), l.LocalPathClientKey()} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want 0600", p, fi, err)
		}
	}
	// The server keeps only a hash of the password.
	pw, _ := os.ReadFile(l.NodePasswordFile())
	s, err := f.cs.CoreV1().Secrets(Namespace).Get(context.Background(), NodePasswordSecret("agent-1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(s.Data["hash"]), strings.TrimSpace(string(pw))) {
		t.Error("the node password is stored in the clear")
	}
	// The same node joins again (a restart) with its kept password.
	if err := f.join(dir, "agent-1", tok); err != nil {
		t.Fatalf("rejoin: %v", err)
	}
}

// A joining node's identities are bound: the node's own to its agent
// parts' roles, its local-path provisioner's to the provisioner's role.
func TestAgentRBAC(t *testing.T) {
	cs := fake.NewClientset()
	if err := AgentRBAC(context.Background(), cs, "agent-1"); err != nil {
		t.Fatal(err)
	}
	crb, err := cs.RbacV1().ClusterRoleBindings().Get(context.Background(), localpath.RoleName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(crb.Subjects) != 1 || crb.Subjects[0].Name != "k3sm:local-path-provisioner:agent-1" {
		t.Fatalf("local-path binding subjects %+v", crb.Subjects)
	}
}

func TestJoinRefusals(t *testing.T) {
	f := newFixture(t)
	good := f.token(t, time.Hour)
	if err := f.join(t.TempDir(), "taken", good); err != nil {
		t.Fatal(err)
	}
	deleted := f.token(t, 0)
	if err := DeleteToken(context.Background(), f.cs, deleted.String()); err != nil {
		t.Fatal(err)
	}
	expiring := f.token(t, time.Minute)
	wrongCA := good
	wrongCA.CAHash = joinv1.CAHash([]byte("another cluster"))
	wrongSecret := good
	wrongSecret.Secret = "0000000000000000"
	cases := []struct {
		name, node string
		tok        joinv1.Token
		later      time.Duration
		want       string
	}{
		{"wrong CA hash", "a1", wrongCA, 0, "not the one the token pins"},
		{"deleted token", "a2", deleted, 0, "not valid"},
		{"wrong secret", "a3", wrongSecret, 0, "not valid"},
		{"expired token", "a4", expiring, 2 * time.Minute, "not valid"},
		{"name taken, other password", "taken", good, 0, "taken by another node"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.now = time.Now().Add(c.later)
			dir := t.TempDir()
			err := f.join(dir, c.node, c.tok)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), c.tok.Secret) {
				t.Errorf("the error shows the token's secret: %v", err)
			}
			if left := files(t, dir); len(left) > 0 {
				t.Errorf("a refused join left %v", left)
			}
			if c.node != "taken" {
				if _, err := f.cs.CoreV1().Secrets(Namespace).Get(context.Background(), NodePasswordSecret(c.node), metav1.GetOptions{}); err == nil {
					t.Error("a refused join stored a node password")
				}
			}
		})
	}
}

func TestTokens(t *testing.T) {
	f := newFixture(t)
	a := f.token(t, time.Hour)
	b := f.token(t, 0)
	if !strings.HasPrefix(a.String(), "K10"+joinv1.CAHash(f.caPEM)+"::") {
		t.Fatalf("token %s does not pin the CA", a)
	}
	list, err := ListTokens(context.Background(), f.cs)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %v %v", list, err)
	}
	for _, ti := range list {
		if ti.ID == a.ID && ti.Expires.IsZero() || ti.ID == b.ID && !ti.Expires.IsZero() || ti.Description != "test" {
			t.Errorf("listed %+v", ti)
		}
	}
	if err := DeleteToken(context.Background(), f.cs, b.ID); err != nil {
		t.Fatal(err)
	}
	if err := DeleteToken(context.Background(), f.cs, b.ID); err == nil || !strings.Contains(err.Error(), "no token") {
		t.Fatalf("second delete: %v", err)
	}
	if err := DeleteToken(context.Background(), f.cs, "bad id!"); err == nil {
		t.Fatal("a malformed id was accepted")
	}
	if _, err := CreateToken(context.Background(), f.cs, f.caPEM, -time.Hour, "", f.now); err == nil || !strings.Contains(err.Error(), "--ttl") {
		t.Fatalf("negative ttl: %v", err)
	}
}

func poolOf(pemData []byte) *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(pemData)
	return p
}
