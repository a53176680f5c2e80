// Package join is a node's side of joining a cluster (the server's side is
// internal/server/join, the contract api/join/v1): it checks the server's
// CA against the token before it sends anything secret, keeps the node's
// password and private keys on the node, sends only CSRs, and writes the
// certificates, kubeconfig and cluster settings the node runs with, and
// nothing at all when the server refuses.
package join

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
	"github.com/k3sm-dev/k3sm/internal/pki"
)

// Options are what `k3sm agent` joins with.
type Options struct {
	// Server is the join endpoint, https://HOST:PORT (the server's --supervisor-port).
	Server   string
	Token    joinv1.Token
	NodeName string
	// NodeIPs go into the kubelet API's serving certificate.
	NodeIPs []net.IP
	DataDir string
	// APIServer, when set, is the apiserver URL the node's kubeconfigs
	// name (the agent's load balancer over the servers) instead of the
	// first server the join lists.
	APIServer string
	// Timeout bounds each request (30 s when zero).
	Timeout time.Duration
}

// ParseServer checks --server: an https URL with a host and port, no path.
func ParseServer(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", fmt.Errorf("--server %q: want the server's join endpoint as https://HOST:PORT (port %s unless the server's --supervisor-port says otherwise)", s, "9345")
	}
	return "https://" + u.Host, nil
}

// Join enrolls the node and returns the cluster settings; on success the
// data dir holds everything the node needs to reach the apiserver.
func Join(ctx context.Context, o Options) (*joinv1.JoinResponse, error) {
	server, err := ParseServer(o.Server)
	if err != nil {
		return nil, err
	}
	timeout := o.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	caPEM, err := fetchCA(ctx, server, timeout)
	if err != nil {
		return nil, err
	}
	if !o.Token.MatchesCA(caPEM) {
		return nil, fmt.Errorf("the server's CA (sha256 %s) is not the one the token pins (%s): the token is for another cluster, or something between here and %s is not the server; copy the token again from `k3sm token create` on the server",
			joinv1.CAHash(caPEM), o.Token.CAHash, server)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the server's CA is not PEM certificates")
	}
	l := datadir.New(o.DataDir)
	password, err := readPassword(l.NodePasswordFile())
	if err != nil {
		return nil, err
	}
	newPassword := password == ""
	if newPassword {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		password = hex.EncodeToString(b)
	}
	user := joinv1.NodeUser(o.NodeName)
	subject := pkix.Name{CommonName: user, Organization: []string{joinv1.NodesGroup}}
	clientKey, clientCSR, err := newCSR(&x509.CertificateRequest{Subject: subject})
	if err != nil {
		return nil, err
	}
	servingKey, servingCSR, err := newCSR(&x509.CertificateRequest{Subject: subject, DNSNames: []string{o.NodeName, "localhost"},
		IPAddresses: append([]net.IP{net.IPv4(127, 0, 0, 1)}, o.NodeIPs...)})
	if err != nil {
		return nil, err
	}
	lpKey, lpCSR, err := newCSR(&x509.CertificateRequest{Subject: pkix.Name{CommonName: joinv1.LocalPathUser(o.NodeName)}})
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(joinv1.JoinRequest{NodeName: o.NodeName, NodePassword: password, ClientCSR: clientCSR, ServingCSR: servingCSR,
		LocalPathCSR: lpCSR})
	if err != nil {
		return nil, err
	}
	resp, err := post(ctx, server, pool, o.Token, body, timeout)
	if err != nil {
		return nil, err
	}
	if err := verify(resp, o.NodeName, pool, caPEM); err != nil {
		return nil, err
	}
	// Accepted: now, and only now, the node's files are written.
	if err := os.MkdirAll(l.AgentTLSDir(), 0o700); err != nil {
		return nil, err
	}
	files := []struct {
		path string
		data []byte
	}{
		{l.NodeClientKey(), clientKey}, {l.NodeClientCert(), []byte(resp.ClientCert)},
		{l.KubeletServingKey(), servingKey}, {l.KubeletServingCert(), []byte(resp.ServingCert)},
		{l.KubeletClientCA(), []byte(resp.KubeletClientCA)}, {l.AgentServerCA(), caPEM},
		{l.LocalPathClientKey(), lpKey}, {l.LocalPathClientCert(), []byte(resp.LocalPathCert)},
	}
	if newPassword {
		files = append(files, struct {
			path string
			data []byte
		}{l.NodePasswordFile(), []byte(password + "\n")})
	}
	for _, f := range files {
		if err := atomicfile.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	api := resp.Cluster.Servers[0]
	if o.APIServer != "" {
		api = o.APIServer
	}
	if err := kubeconfig.WriteClient(l.NodeKubeconfig(), api, caPEM,
		pki.Leaf{CertPath: l.NodeClientCert(), KeyPath: l.NodeClientKey()}, "node"); err != nil {
		return nil, err
	}
	if err := kubeconfig.WriteClient(l.LocalPathKubeconfig(), api, caPEM,
		pki.Leaf{CertPath: l.LocalPathClientCert(), KeyPath: l.LocalPathClientKey()}, "local-path"); err != nil {
		return nil, err
	}
	settings, err := json.MarshalIndent(resp.Cluster, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(l.JoinFile(), append(settings, '\n'), 0o600); err != nil {
		return nil, err
	}
	return resp, nil
}

// fetchCA reads the server's CA without verifying the server: nothing
// secret is sent, and what comes back is checked against the token.
func fetchCA(ctx context.Context, server string, timeout time.Duration) ([]byte, error) {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // checked against the token's hash
		Proxy:           nil,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, server+joinv1.PathCACerts, nil)
	if err != nil {
		return nil, err
	}
	r, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reach the server's join endpoint: %w (is `k3sm server` running there, and --server its --supervisor-port?)", err)
	}
	defer r.Body.Close()
	if r.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s%s answered %s: is it a k3sm server's join endpoint?", server, joinv1.PathCACerts, r.Status)
	}
	return io.ReadAll(io.LimitReader(r.Body, 64<<10))
}

func post(ctx context.Context, server string, pool *x509.CertPool, tok joinv1.Token, body []byte, timeout time.Duration) (*joinv1.JoinResponse, error) {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, Proxy: nil}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, server+joinv1.PathJoin, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok.Bearer())
	req.Header.Set("Content-Type", "application/json")
	r, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	defer r.Body.Close()
	if r.StatusCode != http.StatusOK {
		var je joinv1.Error
		decoded := json.NewDecoder(io.LimitReader(r.Body, 16<<10)).Decode(&je) == nil && je.Message != ""
		if r.StatusCode == http.StatusServiceUnavailable {
			return nil, fmt.Errorf("%w (%s): %s", errUnavailable, r.Status, je.Message)
		}
		if decoded {
			return nil, fmt.Errorf("the server refused the join (%s): %w", r.Status, &je)
		}
		return nil, fmt.Errorf("the server refused the join: %s", r.Status)
	}
	resp, err := joinv1.DecodeJoinResponse(r.Body)
	if err != nil {
		return nil, err
	}
	return &resp, nil
}

// verify checks that the certificates are the node's, from the cluster's CA.
func verify(resp *joinv1.JoinResponse, node string, pool *x509.CertPool, caPEM []byte) error {
	if resp.ServerCA != string(caPEM) {
		return errors.New("join response: the server's CA changed during the join; join again")
	}
	if resp.LocalPathCert == "" {
		return errors.New("join response: no certificate for the node's local-path provisioner: the server's k3sm is older than this agent's; upgrade the server first")
	}
	for _, c := range []struct {
		name, pem string
		usage     x509.ExtKeyUsage
		cn        string
	}{{"client", resp.ClientCert, x509.ExtKeyUsageClientAuth, joinv1.NodeUser(node)}, {"serving", resp.ServingCert, x509.ExtKeyUsageServerAuth, joinv1.NodeUser(node)},
		{"local-path provisioner's", resp.LocalPathCert, x509.ExtKeyUsageClientAuth, joinv1.LocalPathUser(node)}} {
		b, _ := pem.Decode([]byte(c.pem))
		if b == nil {
			return fmt.Errorf("join response: the %s certificate is not PEM", c.name)
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return fmt.Errorf("join response: %s certificate: %w", c.name, err)
		}
		if cert.Subject.CommonName != c.cn {
			return fmt.Errorf("join response: the %s certificate is for %q, not this node", c.name, cert.Subject.CommonName)
		}
		if c.usage == x509.ExtKeyUsageServerAuth {
			if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
				return fmt.Errorf("join response: %s certificate: %w", c.name, err)
			}
		}
	}
	return nil
}

func newCSR(tmpl *x509.CertificateRequest) (keyPEM []byte, csrPEM string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, "", err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, "", err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
		string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), nil
}

// readPassword returns the node's password, "" when it has none yet.
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("node password: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Retryable reports whether a failed join may succeed later unchanged (the
// server unreachable or restarting), as opposed to a refusal or a bad CA.
func Retryable(err error) bool {
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &oe) || errors.As(err, &ne) || errors.Is(err, errUnavailable)
}

// errUnavailable marks a server that answered but could not serve the join yet.
var errUnavailable = errors.New("the server is not ready to serve joins")
