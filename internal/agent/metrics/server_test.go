package metrics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/pki"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

type recordingAuthorizer struct {
	mu    sync.Mutex
	seen  []authorizer.Attributes
	allow func(authorizer.Attributes) bool
}

func (r *recordingAuthorizer) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, a)
	if r.allow(a) {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "no RBAC rule", nil
}

func clientFor(t *testing.T, ca *pki.CA, dir, cn string, roots *x509.CertPool) *http.Client {
	t.Helper()
	leaf, err := ca.Ensure(dir, cn, pki.LeafSpec{CommonName: cn, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(leaf.CertPath, leaf.KeyPath)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}}}
}

// TestHandlerFrontProxyAuth: only the front proxy's certificate (right CA,
// allowed name) gets in; the user in its headers is authorized per request
// with the resource attributes the apiserver would use.
func TestHandlerFrontProxyAuth(t *testing.T) {
	dir := t.TempDir()
	proxyCA, err := pki.LoadOrCreateCA(dir, "requestheader-ca", "requestheader")
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := pki.LoadOrCreateCA(dir, "client-ca", "clients")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(proxyCA.Cert)
	authz := &recordingAuthorizer{allow: func(a authorizer.Attributes) bool {
		return a.GetUser().GetName() == "alice" && slices.Contains(a.GetUser().GetGroups(), "system:authenticated")
	}}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "reached") })
	srv := httptest.NewUnstartedServer(Handler(FrontProxyAuthenticator(pool, []string{"system:auth-proxy"}), authz, next))
	// Only the request-header CA's certificates pass the handshake; a client
	// without one reaches the handler and is refused there.
	srv.TLS = &tls.Config{ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven}
	srv.StartTLS()
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())

	do := func(c *http.Client, user string) (int, string, error) {
		req, _ := http.NewRequest("GET", srv.URL+"/apis/metrics.k8s.io/v1beta1/namespaces/ns1/pods/p1", nil)
		req.Header.Set("X-Remote-User", user)
		req.Header.Add("X-Remote-Group", "devs")
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	if code, body, err := do(plain, "alice"); err != nil || code != http.StatusUnauthorized {
		t.Errorf("no client certificate: %d %s %v", code, body, err)
	}
	// (Go's client does not even offer a certificate the server's CA list
	// does not name; either way it must not get in.)
	if code, body, err := do(clientFor(t, otherCA, dir, "system:auth-proxy", roots), "alice"); err == nil && code != http.StatusUnauthorized {
		t.Errorf("a certificate from another CA: %d %s", code, body)
	}
	if code, body, err := do(clientFor(t, proxyCA, dir, "someone-else", roots), "alice"); err != nil || code != http.StatusUnauthorized {
		t.Errorf("a front-proxy CA certificate with a name not allowed: %d %s %v", code, body, err)
	}
	proxy := clientFor(t, proxyCA, dir, "system:auth-proxy", roots)
	if code, body, err := do(proxy, "bob"); err != nil || code != http.StatusForbidden {
		t.Errorf("unauthorized user: %d %s %v", code, body, err)
	}
	code, body, err := do(proxy, "alice")
	if err != nil || code != http.StatusOK || body != "reached" {
		t.Fatalf("authorized user: %d %s %v", code, body, err)
	}
	a := authz.seen[len(authz.seen)-1]
	if a.GetVerb() != "get" || a.GetAPIGroup() != "metrics.k8s.io" || a.GetResource() != "pods" || a.GetNamespace() != "ns1" ||
		a.GetName() != "p1" || !a.IsResourceRequest() || !slices.Contains(a.GetUser().GetGroups(), "devs") {
		t.Errorf("attributes: %+v user %+v", a, a.GetUser())
	}
}
