// Package pki owns the cluster's key material: certificate authorities, leaf
// certificates and the service-account signing key. Everything is ECDSA P-256
// (fast to generate, accepted by every Kubernetes component) and written with
// 0600 files inside 0700 directories.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

const (
	// CAValidity is how long generated authorities live.
	CAValidity = 10 * 365 * 24 * time.Hour
	// LeafValidity is how long generated leaf certificates live.
	LeafValidity = 365 * 24 * time.Hour
	// RenewBefore is the remaining lifetime under which a leaf is re-issued at start.
	RenewBefore = 90 * 24 * time.Hour
)

// CA is a loaded certificate authority able to sign leaves.
type CA struct {
	Cert     *x509.Certificate
	Key      crypto.Signer
	CertPath string
	KeyPath  string
}

// CertPEM returns the CA certificate in PEM form.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// LeafSpec describes a leaf certificate to issue.
type LeafSpec struct {
	CommonName   string
	Organization []string
	DNSNames     []string
	IPs          []net.IP
	Client       bool
	Server       bool
}

// Leaf is an issued certificate on disk.
type Leaf struct {
	CertPath string
	KeyPath  string
}

// LoadOrCreateCA loads the CA at dir/name.{crt,key}, creating it when absent.
func LoadOrCreateCA(dir, name, commonName string) (*CA, error) {
	ca := &CA{CertPath: filepath.Join(dir, name+".crt"), KeyPath: filepath.Join(dir, name+".key")}
	if cert, key, err := loadPair(ca.CertPath, ca.KeyPath); err == nil {
		if !cert.IsCA {
			return nil, fmt.Errorf("%s is not a CA certificate; move it away to let k3sm create a new one", ca.CertPath)
		}
		ca.Cert, ca.Key = cert, key
		return ca, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: fmt.Sprintf("%s@%d", commonName, now.Unix())},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	if err := writePair(ca.CertPath, ca.KeyPath, der, key); err != nil {
		return nil, err
	}
	ca.Cert, ca.Key = cert, key
	return ca, nil
}

// Ensure returns the leaf at dir/name.{crt,key}, issuing it when it is absent,
// not signed by this CA, about to expire, or different from spec (for example a
// new --tls-san).
func (ca *CA) Ensure(dir, name string, spec LeafSpec) (Leaf, error) {
	leaf := Leaf{CertPath: filepath.Join(dir, name+".crt"), KeyPath: filepath.Join(dir, name+".key")}
	if cert, _, err := loadPair(leaf.CertPath, leaf.KeyPath); err == nil && ca.matches(cert, spec) {
		return leaf, nil
	}
	der, key, err := ca.Sign(spec)
	if err != nil {
		return leaf, err
	}
	return leaf, writePair(leaf.CertPath, leaf.KeyPath, der, key)
}

// Sign issues a new key pair and certificate for spec.
func (ca *CA) Sign(spec LeafSpec) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := ca.SignPublicKey(spec, key.Public(), LeafValidity)
	return der, key, err
}

// SignPublicKey issues a certificate for an existing public key (CSR signing).
func (ca *CA) SignPublicKey(spec LeafSpec, pub crypto.PublicKey, validity time.Duration) ([]byte, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: spec.CommonName, Organization: spec.Organization},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		DNSNames:     spec.DNSNames,
		IPAddresses:  spec.IPs,
	}
	if spec.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	if spec.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
}

func (ca *CA) matches(cert *x509.Certificate, spec LeafSpec) bool {
	if cert.CheckSignatureFrom(ca.Cert) != nil || time.Until(cert.NotAfter) < RenewBefore {
		return false
	}
	if cert.Subject.CommonName != spec.CommonName || !sameStrings(cert.Subject.Organization, spec.Organization) {
		return false
	}
	if !sameStrings(cert.DNSNames, spec.DNSNames) {
		return false
	}
	var have, want []string
	for _, ip := range cert.IPAddresses {
		have = append(have, ip.String())
	}
	for _, ip := range spec.IPs {
		want = append(want, ip.String())
	}
	if !sameStrings(have, want) {
		return false
	}
	hasUsage := func(u x509.ExtKeyUsage) bool { return slices.Contains(cert.ExtKeyUsage, u) }
	return hasUsage(x509.ExtKeyUsageClientAuth) == spec.Client && hasUsage(x509.ExtKeyUsageServerAuth) == spec.Server
}

// EnsureKey writes a standalone private key (the service-account signing key)
// when absent and returns its path and the PEM of its public half.
func EnsureKey(path string) (pubPEM []byte, err error) {
	var key crypto.Signer
	if data, err := os.ReadFile(path); err == nil {
		key, err = parseKey(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	} else if errors.Is(err, os.ErrNotExist) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		key = k
		if err := writeKey(path, k); err != nil {
			return nil, err
		}
	} else {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

func loadPair(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, err
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("%s: no PEM certificate", certPath)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", certPath, err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	return cert, key, nil
}

func parseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM private key")
	}
	switch block.Type {
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(block.Bytes)
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, err
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, errors.New("unsupported private key type")
		}
		return s, nil
	}
	return nil, fmt.Errorf("unsupported PEM block %q", block.Type)
}

func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	if err := writeKey(keyPath, key); err != nil {
		return err
	}
	return WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
}

// WriteFile writes data atomically with mode 0600, creating parent
// directories with mode 0700. Unchanged content is left alone so file
// watchers in the components do not reload for nothing.
func WriteFile(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return atomicfile.WriteFile(path, data, 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return n
}

func sameStrings(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
