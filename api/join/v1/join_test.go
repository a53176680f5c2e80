package v1

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"net"
	"strings"
	"testing"
)

func csrPEM(t testing.TB, cn string, org []string, dns []string, ips []net.IP) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: cn, Organization: org}, DNSNames: dns, IPAddresses: ips}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func TestParseToken(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	tok, err := ParseToken(" K10" + hash + "::abcdef.0123456789abcdef\n")
	if err != nil {
		t.Fatal(err)
	}
	if tok.CAHash != hash || tok.ID != "abcdef" || tok.Secret != "0123456789abcdef" || tok.String() != "K10"+hash+"::abcdef.0123456789abcdef" {
		t.Fatalf("parsed %+v", tok)
	}
	for _, bad := range []string{"", "abcdef.0123456789abcdef", "K10" + hash + "::abcdef:0123456789abcdef",
		"K10" + hash[:10] + "::abcdef.0123456789abcdef", "K10" + strings.ToUpper(hash) + "::abcdef.0123456789abcdef",
		"K10" + hash + "::ABCDEF.0123456789abcdef", "K10" + hash + "::abcdef.0123456789abcde"} {
		_, err := ParseToken(bad)
		if err == nil {
			t.Errorf("%q accepted", bad)
		} else if strings.Contains(err.Error(), "0123456789abcde") {
			t.Errorf("error echoes the secret: %v", err)
		}
	}
}

func TestCAHash(t *testing.T) {
	tok := Token{CAHash: CAHash([]byte("ca"))}
	if !tok.MatchesCA([]byte("ca")) || tok.MatchesCA([]byte("other")) {
		t.Fatal("MatchesCA")
	}
}

func validRequest(t testing.TB) JoinRequest {
	return JoinRequest{NodeName: "agent-1", NodePassword: strings.Repeat("p", 32),
		ClientCSR:    csrPEM(t, "system:node:agent-1", []string{"system:nodes"}, nil, nil),
		ServingCSR:   csrPEM(t, "system:node:agent-1", []string{"system:nodes"}, []string{"agent-1", "localhost"}, []net.IP{net.ParseIP("10.0.0.2")}),
		LocalPathCSR: csrPEM(t, "k3sm:local-path-provisioner:agent-1", nil, nil, nil)}
}

func encode(t testing.TB, r any) string {
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDecodeJoinRequest(t *testing.T) {
	good := validRequest(t)
	if _, c, err := DecodeJoinRequest(strings.NewReader(encode(t, good))); err != nil || c.Client == nil || c.Serving == nil || c.LocalPath == nil {
		t.Fatalf("valid request refused: %v", err)
	}
	// Without a local-path CSR (it is optional).
	good.LocalPathCSR = ""
	if _, c, err := DecodeJoinRequest(strings.NewReader(encode(t, good))); err != nil || c.LocalPath != nil {
		t.Fatalf("valid request without a local-path CSR: %v %v", c.LocalPath, err)
	}
	cases := []struct {
		name, want string
		mut        func(*JoinRequest) string
	}{
		{"unknown field", "unknown field", func(r *JoinRequest) string { return `{"nodeName":"a","extra":1}` }},
		{"trailing data", "after", func(r *JoinRequest) string { return encode(t, r) + "{}" }},
		{"too large", "larger than", func(r *JoinRequest) string { r.NodeName = strings.Repeat("a", MaxRequestBytes); return encode(t, r) }},
		{"bad node name", "nodeName", func(r *JoinRequest) string { r.NodeName = "Agent_1"; return encode(t, r) }},
		{"short password", "nodePassword", func(r *JoinRequest) string { r.NodePassword = "x"; return encode(t, r) }},
		{"not PEM", "clientCSR", func(r *JoinRequest) string { r.ClientCSR = "junk"; return encode(t, r) }},
		{"other node's client", "subject", func(r *JoinRequest) string {
			r.ClientCSR = csrPEM(t, "system:node:agent-2", []string{"system:nodes"}, nil, nil)
			return encode(t, r)
		}},
		{"admin group", "subject", func(r *JoinRequest) string {
			r.ClientCSR = csrPEM(t, "system:node:agent-1", []string{"system:masters"}, nil, nil)
			return encode(t, r)
		}},
		{"extra group", "subject", func(r *JoinRequest) string {
			r.ClientCSR = csrPEM(t, "system:node:agent-1", []string{"system:nodes", "system:masters"}, nil, nil)
			return encode(t, r)
		}},
		{"client SANs", "alternative", func(r *JoinRequest) string {
			r.ClientCSR = csrPEM(t, "system:node:agent-1", []string{"system:nodes"}, []string{"agent-1"}, nil)
			return encode(t, r)
		}},
		{"local-path for another node", "localPathCSR", func(r *JoinRequest) string {
			r.LocalPathCSR = csrPEM(t, "k3sm:local-path-provisioner:agent-2", nil, nil, nil)
			return encode(t, r)
		}},
		{"local-path as a node", "localPathCSR", func(r *JoinRequest) string {
			r.LocalPathCSR = csrPEM(t, "system:node:agent-1", []string{"system:nodes"}, nil, nil)
			return encode(t, r)
		}},
		{"local-path with a group", "localPathCSR", func(r *JoinRequest) string {
			r.LocalPathCSR = csrPEM(t, "k3sm:local-path-provisioner:agent-1", []string{"system:masters"}, nil, nil)
			return encode(t, r)
		}},
		{"local-path SANs", "localPathCSR", func(r *JoinRequest) string {
			r.LocalPathCSR = csrPEM(t, "k3sm:local-path-provisioner:agent-1", nil, []string{"agent-1"}, nil)
			return encode(t, r)
		}},
		{"serving for another name", "DNS name", func(r *JoinRequest) string {
			r.ServingCSR = csrPEM(t, "system:node:agent-1", []string{"system:nodes"}, []string{"kubernetes.default"}, nil)
			return encode(t, r)
		}},
	}
	for _, c := range cases {
		r := validRequest(t)
		_, _, err := DecodeJoinRequest(strings.NewReader(c.mut(&r)))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error naming %q", c.name, err, c.want)
		}
	}
}

func FuzzDecodeJoinRequest(f *testing.F) {
	f.Add(encode(f, validRequest(f)))
	f.Add(`{"nodeName":"a","nodePassword":"0123456789abcdef0","clientCSR":"","servingCSR":""}`)
	f.Add(`{}`)
	f.Fuzz(func(t *testing.T, s string) {
		req, c, err := DecodeJoinRequest(strings.NewReader(s))
		if err != nil {
			return
		}
		// Whatever is accepted is for the node it names, and only for it.
		if c.Client.Subject.CommonName != NodeUser(req.NodeName) || c.Serving.Subject.CommonName != NodeUser(req.NodeName) {
			t.Fatalf("accepted a CSR for another identity: %q, %q for node %q", c.Client.Subject.CommonName, c.Serving.Subject.CommonName, req.NodeName)
		}
		if c.LocalPath != nil && (c.LocalPath.Subject.CommonName != LocalPathUser(req.NodeName) || len(c.LocalPath.Subject.Organization) > 0) {
			t.Fatalf("accepted a local-path CSR for another identity: %v for node %q", c.LocalPath.Subject, req.NodeName)
		}
	})
}

func FuzzParseToken(f *testing.F) {
	f.Add("K10" + strings.Repeat("ab", 32) + "::abcdef.0123456789abcdef")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			return
		}
		again, err := ParseToken(tok.String())
		if err != nil || again != tok {
			t.Fatalf("%q parsed to %+v, which does not round-trip (%v)", s, tok, err)
		}
	})
}
