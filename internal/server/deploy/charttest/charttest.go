// Package charttest is test support for the HelmChart controller: charts
// made by the test, a CA of its own, and chart repositories and OCI
// registries on 127.0.0.1 that want TLS and basic auth. Nothing leaves the
// machine.
package charttest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	helmregistry "helm.sh/helm/v3/pkg/registry"
)

// Chart builds a chart .tgz whose one template is a ConfigMap
// <release>-greeting carrying .Values.greeting.
func Chart(t testing.TB, name, version string) []byte {
	t.Helper()
	files := []struct{ path, body string }{
		{"Chart.yaml", fmt.Sprintf("apiVersion: v2\nname: %s\nversion: %s\n", name, version)},
		{"values.yaml", "greeting: default\n"},
		{"templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-greeting\ndata:\n  greeting: {{ .Values.greeting | quote }}\n"},
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name + "/" + f.path, Mode: 0o644, Size: int64(len(f.body)), ModTime: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// CA is a certificate authority of the test's own.
type CA struct {
	PEM  []byte // the CA certificate, what spec.repoCA takes
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA valid for an hour.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "charttest CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}
}

// ServerTLS is a server configuration with a leaf for 127.0.0.1 signed by ca.
func (ca *CA) ServerTLS(t testing.TB) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}
}

// Client trusts only ca.
func (ca *CA) Client() *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}
}

// Server is an HTTPS server on 127.0.0.1 that wants basic auth.
type Server struct {
	*httptest.Server
	Refused atomic.Int64 // requests answered 401
}

// Serve runs h over TLS (a leaf of ca) behind basic auth user:pass.
func Serve(t testing.TB, ca *CA, user, pass string, h http.Handler) *Server {
	t.Helper()
	s := &Server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			s.Refused.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="charttest"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	s.TLS = ca.ServerTLS(t)
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes refused on purpose
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

// Repo serves a chart repository (index.yaml and charts/NAME-VERSION.tgz)
// of one chart over TLS with basic auth.
func Repo(t testing.TB, ca *CA, user, pass, name, version string) *Server {
	t.Helper()
	tgz := Chart(t, name, version)
	file := fmt.Sprintf("charts/%s-%s.tgz", name, version)
	index := fmt.Sprintf("apiVersion: v1\nentries:\n  %s:\n  - apiVersion: v2\n    name: %s\n    version: %s\n    digest: %x\n    urls: [%s]\ngenerated: \"2026-01-01T00:00:00Z\"\n",
		name, name, version, sha256.Sum256(tgz), file)
	return Serve(t, ca, user, pass, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/index.yaml":
			_, _ = w.Write([]byte(index))
		case "/" + file:
			_, _ = w.Write(tgz)
		default:
			http.NotFound(w, r)
		}
	}))
}

// Registry serves an OCI registry (go-containerregistry's) over TLS with
// basic auth, and pushes the chart NAME:VERSION to it under charts/NAME.
// It returns the server and its host:port.
func Registry(t testing.TB, ca *CA, user, pass, name, version string) (*Server, string) {
	t.Helper()
	s := Serve(t, ca, user, pass, registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	host := s.Listener.Addr().String()
	rc, err := helmregistry.NewClient(helmregistry.ClientOptHTTPClient(ca.Client()), helmregistry.ClientOptBasicAuth(user, pass))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Push(Chart(t, name, version), fmt.Sprintf("%s/charts/%s:%s", host, name, version)); err != nil {
		t.Fatalf("push the chart to the test registry: %v", err)
	}
	return s, host
}
