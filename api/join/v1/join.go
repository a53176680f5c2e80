// Package v1 is the join contract between a k3sm server's supervisor
// endpoint and a node that joins its cluster: the token and the CA hash it
// pins, the endpoint's paths, and the request and response bodies with
// their limits. Both sides decode with the functions here, so they refuse
// the same inputs.
package v1

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Paths of the supervisor endpoint (HTTPS, on the server's --supervisor-port).
const (
	// PathCACerts serves the cluster CA, unauthenticated: the joining node
	// checks it against the token's hash before it sends anything secret.
	PathCACerts = "/v1-k3sm/cacerts"
	// PathJoin takes a JoinRequest with the token as a bearer credential.
	PathJoin = "/v1-k3sm/join"
	// PathServerBootstrap gives a server joining a cluster with embedded
	// etcd (--server, --token) the cluster's bootstrap record, sealed for
	// the token it presents as a bearer credential, and where the etcd
	// members are (ServerBootstrapResponse).
	PathServerBootstrap = "/v1-k3sm/server-bootstrap"
)

// Limits of what either side reads.
const (
	MaxRequestBytes  = 64 << 10
	MaxResponseBytes = 256 << 10
	maxCSRBytes      = 8 << 10
	minPasswordLen   = 16
	maxPasswordLen   = 256
)

// TokenPrefix starts every join token, as k3s's secure tokens start.
const TokenPrefix = "K10"

var (
	tokenIDRe     = regexp.MustCompile(`\A[a-z0-9]{6}\z`)
	tokenSecretRe = regexp.MustCompile(`\A[a-z0-9]{16}\z`)
	caHashRe      = regexp.MustCompile(`\A[0-9a-f]{64}\z`)
)

// Token is a join token: K10<CA hash>::<id>.<secret>. The id and secret are
// an upstream bootstrap token's (the Secret kube-system/bootstrap-token-<id>).
type Token struct {
	CAHash     string
	ID, Secret string
}

// String is the token as `k3sm token create` prints it.
func (t Token) String() string { return TokenPrefix + t.CAHash + "::" + t.ID + "." + t.Secret }

// Bearer is what the node sends on PathJoin: the bootstrap token alone.
func (t Token) Bearer() string { return t.ID + "." + t.Secret }

// ParseToken reads a join token; the error says what is wrong without
// echoing the secret.
func ParseToken(s string) (Token, error) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, TokenPrefix)
	hash, cred, ok2 := strings.Cut(rest, "::")
	if !ok || !ok2 {
		return Token{}, errors.New("--token: not a k3sm join token (K10<CA hash>::<id>.<secret>): copy the last line `k3sm token create` printed on the server")
	}
	if !caHashRe.MatchString(hash) {
		return Token{}, errors.New("--token: the CA hash after K10 is not 64 lowercase hex digits: copy the whole token")
	}
	t, err := ParseBearer(cred)
	if err != nil {
		return Token{}, fmt.Errorf("--token: %w", err)
	}
	t.CAHash = hash
	return t, nil
}

// ParseBearer reads <id>.<secret>, as the endpoint receives it.
func ParseBearer(s string) (Token, error) {
	id, secret, ok := strings.Cut(s, ".")
	if !ok || !tokenIDRe.MatchString(id) || !tokenSecretRe.MatchString(secret) {
		return Token{}, errors.New("the credential is not <id>.<secret> (6 and 16 characters of [a-z0-9])")
	}
	return Token{ID: id, Secret: secret}, nil
}

// CAHash is the hex SHA-256 of the CA bundle PathCACerts serves.
func CAHash(caPEM []byte) string {
	sum := sha256.Sum256(caPEM)
	return hex.EncodeToString(sum[:])
}

// MatchesCA reports, in constant time, whether caPEM is the CA the token pins.
func (t Token) MatchesCA(caPEM []byte) bool {
	return subtle.ConstantTimeCompare([]byte(CAHash(caPEM)), []byte(t.CAHash)) == 1
}

// JoinRequest is what a node sends to PathJoin.
type JoinRequest struct {
	// NodeName is the Node the certificates are for.
	NodeName string `json:"nodeName"`
	// NodePassword is this node's own secret, kept on the node: the first
	// join of a name stores its hash, and later joins of that name must
	// present the same password.
	NodePassword string `json:"nodePassword"`
	// ClientCSR and ServingCSR are PEM certificate requests for the
	// node's client certificate (CN system:node:<name>, O system:nodes)
	// and its kubelet API serving certificate. The keys stay on the node.
	ClientCSR  string `json:"clientCSR"`
	ServingCSR string `json:"servingCSR"`
	// LocalPathCSR requests the client certificate of the node's
	// local-path provisioner (CN LocalPathUser(name), no group): its own
	// identity, bound to what provisioning volumes needs, never the node's.
	LocalPathCSR string `json:"localPathCSR,omitempty"`
}

// JoinResponse is what the server answers.
type JoinResponse struct {
	ClientCert  string `json:"clientCert"`
	ServingCert string `json:"servingCert"`
	// LocalPathCert answers LocalPathCSR.
	LocalPathCert string `json:"localPathCert,omitempty"`
	// ServerCA verifies the apiserver (and this endpoint).
	ServerCA string `json:"serverCA"`
	// KubeletClientCA verifies the apiserver's calls to the node's kubelet API.
	KubeletClientCA string          `json:"kubeletClientCA"`
	Cluster         ClusterSettings `json:"cluster"`
}

// ClusterSettings are what every node of the cluster runs with.
type ClusterSettings struct {
	// Servers are the apiserver URLs (https://HOST:PORT).
	Servers     []string `json:"servers"`
	ClusterCIDR string   `json:"clusterCIDR"`
	ServiceCIDR string   `json:"serviceCIDR"`
	// APIServiceIP is the kubernetes Service's ClusterIP in ServiceCIDR.
	APIServiceIP  string `json:"apiServiceIP"`
	ClusterDNS    string `json:"clusterDNS"`
	ClusterDomain string `json:"clusterDomain"`
}

// ServerBootstrapResponse answers PathServerBootstrap.
type ServerBootstrapResponse struct {
	// Record is the bootstrap record sealed for the bearer token (package
	// serverboot): only that token's secret opens it.
	Record []byte `json:"record"`
	// EtcdClientURLs are the etcd members' client URLs, through which the
	// joining server adds itself as a member.
	EtcdClientURLs []string `json:"etcdClientURLs"`
}

// Error is the body of every refusal: what is wrong and what to do.
type Error struct {
	Message string `json:"error"`
	Fix     string `json:"fix,omitempty"`
}

func (e *Error) Error() string {
	if e.Fix == "" {
		return e.Message
	}
	return e.Message + ": " + e.Fix
}

// NodeCSRs are a join request's parsed certificate requests.
type NodeCSRs struct {
	Client, Serving *x509.CertificateRequest
	// LocalPath is nil when the request has none.
	LocalPath *x509.CertificateRequest
}

// DecodeJoinRequest reads and validates a JoinRequest of at most
// MaxRequestBytes: known fields only, a valid node name, a password of
// sane length, and well-formed, self-signed CSRs for that node (two, and
// the local-path provisioner's when present).
func DecodeJoinRequest(r io.Reader) (JoinRequest, NodeCSRs, error) {
	var req JoinRequest
	var none NodeCSRs
	data, err := io.ReadAll(io.LimitReader(r, MaxRequestBytes+1))
	if err != nil {
		return req, none, err
	}
	if len(data) > MaxRequestBytes {
		return req, none, fmt.Errorf("request larger than %d bytes", MaxRequestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, none, fmt.Errorf("request is not a join request: %v", err)
	}
	if dec.More() {
		return req, none, errors.New("request has data after the join request")
	}
	if errs := validation.IsDNS1123Subdomain(req.NodeName); len(errs) > 0 {
		return req, none, fmt.Errorf("nodeName %q: %s", req.NodeName, strings.Join(errs, "; "))
	}
	if n := len(req.NodePassword); n < minPasswordLen || n > maxPasswordLen {
		return req, none, fmt.Errorf("nodePassword: %d characters, want %d to %d", n, minPasswordLen, maxPasswordLen)
	}
	client, err := parseCSR("clientCSR", req.ClientCSR)
	if err != nil {
		return req, none, err
	}
	serving, err := parseCSR("servingCSR", req.ServingCSR)
	if err != nil {
		return req, none, err
	}
	user := NodeUser(req.NodeName)
	for _, c := range []struct {
		field string
		csr   *x509.CertificateRequest
	}{{"clientCSR", client}, {"servingCSR", serving}} {
		if c.csr.Subject.CommonName != user || len(c.csr.Subject.Organization) != 1 || c.csr.Subject.Organization[0] != NodesGroup {
			return req, none, fmt.Errorf("%s: subject must be CN=%s, O=%s", c.field, user, NodesGroup)
		}
	}
	if hasSANs(client) {
		return req, none, errors.New("clientCSR: a client certificate has no subject alternative names")
	}
	if len(serving.EmailAddresses)+len(serving.URIs) > 0 {
		return req, none, errors.New("servingCSR: only DNS names and IP addresses may be requested")
	}
	for _, d := range serving.DNSNames {
		if d != req.NodeName && d != "localhost" {
			return req, none, fmt.Errorf("servingCSR: DNS name %q is not the node's name %q", d, req.NodeName)
		}
	}
	if len(serving.IPAddresses) > 16 {
		return req, none, errors.New("servingCSR: more than 16 IP addresses")
	}
	csrs := NodeCSRs{Client: client, Serving: serving}
	if req.LocalPathCSR != "" {
		lp, err := parseCSR("localPathCSR", req.LocalPathCSR)
		if err != nil {
			return req, none, err
		}
		if want := LocalPathUser(req.NodeName); lp.Subject.CommonName != want || len(lp.Subject.Organization) > 0 {
			return req, none, fmt.Errorf("localPathCSR: subject must be CN=%s and no organization", want)
		}
		if hasSANs(lp) {
			return req, none, errors.New("localPathCSR: a client certificate has no subject alternative names")
		}
		csrs.LocalPath = lp
	}
	return req, csrs, nil
}

func hasSANs(csr *x509.CertificateRequest) bool {
	return len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses)+len(csr.URIs) > 0
}

// The node identity the Node authorizer knows.
const NodesGroup = "system:nodes"

// NodeUser is the user name of node name's certificates.
func NodeUser(name string) string { return "system:node:" + name }

// LocalPathUser is the user name of node name's local-path provisioner:
// its own identity, bound to the provisioner's ClusterRole, never the
// node's or an admin's.
func LocalPathUser(name string) string { return "k3sm:local-path-provisioner:" + name }

func parseCSR(field, s string) (*x509.CertificateRequest, error) {
	if len(s) > maxCSRBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", field, maxCSRBytes)
	}
	b, rest := pem.Decode([]byte(s))
	if b == nil || b.Type != "CERTIFICATE REQUEST" || len(bytes.TrimSpace(rest)) > 0 {
		return nil, fmt.Errorf("%s: not one PEM CERTIFICATE REQUEST", field)
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", field, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%s: signature: %v", field, err)
	}
	return csr, nil
}

// DecodeJoinResponse reads the server's answer (at most MaxResponseBytes).
func DecodeJoinResponse(r io.Reader) (JoinResponse, error) {
	var resp JoinResponse
	dec := json.NewDecoder(io.LimitReader(r, MaxResponseBytes))
	if err := dec.Decode(&resp); err != nil {
		return resp, fmt.Errorf("join response: %v", err)
	}
	if resp.ClientCert == "" || resp.ServingCert == "" || resp.ServerCA == "" || resp.KubeletClientCA == "" || len(resp.Cluster.Servers) == 0 {
		return resp, errors.New("join response lacks certificates or servers: is the server a k3sm of the same version?")
	}
	return resp, nil
}
