// Package certs lists and re-issues the certificates under a k3sm data
// directory (`k3sm certificate check|rotate`). Issuing itself is
// internal/pki's: a leaf re-issued here keeps its names and usages, so the
// server's next start (whose pki Ensure re-issues leaves that are missing,
// renamed, signed by another CA or within pki.RenewBefore of expiry) keeps it.
package certs

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"k8s.io/client-go/tools/clientcmd"
)

// CAs are the authorities of a k3sm cluster, by file name (server/tls/<name>.crt).
var CAs = []string{"server-ca", "client-ca", "request-header-ca"}

// Services groups the leaf certificates by the component that uses them
// (file names without .crt; server/tls/ unless under agent/tls/).
var Services = map[string][]string{
	"kube-apiserver":          {"serving-kube-apiserver", "client-kube-apiserver", "client-auth-proxy"},
	"kube-scheduler":          {"serving-kube-scheduler", "client-kube-scheduler"},
	"kube-controller-manager": {"serving-kube-controller-manager", "client-kube-controller-manager"},
	"admin":                   {"client-admin"},
	"node":                    {"agent/client-kubelet", "agent/serving-kubelet", "agent/client-local-path", "agent/serving-metrics"},
}

// ServiceNames lists Services' keys, sorted.
func ServiceNames() []string {
	var out []string
	for k := range Services {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Cert is one certificate on disk.
type Cert struct {
	Name      string    `json:"name"`
	File      string    `json:"file"`
	CA        bool      `json:"ca"`
	Service   string    `json:"service,omitempty"`
	Subject   string    `json:"subject"`
	Issuer    string    `json:"issuer"`
	NotBefore time.Time `json:"notBefore"`
	NotAfter  time.Time `json:"notAfter"`
	DaysLeft  int       `json:"daysLeft"`
	// Status: ok, renew (a leaf the next start re-issues), expired, or for a
	// CA within a year of expiry, rotate-ca.
	Status string `json:"status"`
}

func serviceOf(name string) string {
	for s, names := range Services {
		if slices.Contains(names, name) {
			return s
		}
	}
	return ""
}

// Check lists every certificate of the data dir, CAs first, then leaves by service and name.
func Check(dataDir string, now time.Time) ([]Cert, error) {
	l := datadir.New(dataDir)
	if _, err := os.Stat(l.TLS("server-ca.crt")); err != nil {
		return nil, fmt.Errorf("no k3sm cluster at %s (no %s): start `k3sm server --data-dir %s` first, or pass the data dir of an existing cluster with --data-dir or $K3SM_DATA_DIR",
			dataDir, l.TLS("server-ca.crt"), dataDir)
	}
	var out []Cert
	for _, dir := range []struct{ path, prefix string }{{l.TLSDir(), ""}, {l.AgentTLSDir(), "agent/"}} {
		files, _ := filepath.Glob(filepath.Join(dir.path, "*.crt"))
		for _, f := range files {
			cert, err := load(f)
			if err != nil {
				return nil, err
			}
			name := dir.prefix + strings.TrimSuffix(filepath.Base(f), ".crt")
			if dir.prefix != "" && cert.IsCA {
				continue // agent/tls/client-ca.crt is a copy of the client CA
			}
			c := Cert{Name: name, File: f, CA: cert.IsCA, Service: serviceOf(name), Subject: cert.Subject.CommonName,
				Issuer: cert.Issuer.CommonName, NotBefore: cert.NotBefore, NotAfter: cert.NotAfter,
				DaysLeft: int(cert.NotAfter.Sub(now).Hours() / 24)}
			switch left := cert.NotAfter.Sub(now); {
			case left <= 0:
				c.Status = "expired"
			case c.CA && left < 365*24*time.Hour:
				c.Status = "rotate-ca"
			case !c.CA && left < pki.RenewBefore:
				c.Status = "renew"
			default:
				c.Status = "ok"
			}
			out = append(out, c)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].CA != out[j].CA {
			return out[i].CA
		}
		if out[i].Service != out[j].Service {
			return out[i].Service < out[j].Service
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

func load(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cert, nil
}

// Rotated is one re-issued leaf.
type Rotated struct {
	Name        string    `json:"name"`
	OldNotAfter time.Time `json:"oldNotAfter"`
	NotAfter    time.Time `json:"notAfter"`
}

// Rotate re-issues the leaves of services (all when empty) with new keys,
// the same names and usages and a full lifetime, and rewrites the
// kubeconfigs that embed them. The caller holds the data dir's lock: the
// components read their certificates when they start.
func Rotate(dataDir string, services []string) ([]Rotated, []string, error) {
	l := datadir.New(dataDir)
	var names []string
	if len(services) == 0 {
		all, err := Check(dataDir, time.Now())
		if err != nil {
			return nil, nil, err
		}
		for _, c := range all {
			if !c.CA {
				names = append(names, c.Name)
			}
		}
	} else {
		if _, err := Check(dataDir, time.Now()); err != nil {
			return nil, nil, err
		}
		for _, s := range services {
			leaves, ok := Services[s]
			if !ok {
				return nil, nil, fmt.Errorf("--service %q: not a service; use one of %s (repeatable), or none for every leaf",
					s, strings.Join(ServiceNames(), ", "))
			}
			names = append(names, leaves...)
		}
	}
	cas := map[string]*pki.CA{}
	for _, n := range CAs {
		if _, err := os.Stat(l.TLS(n + ".crt")); err != nil {
			return nil, nil, fmt.Errorf("CA %s: %w", n, err)
		}
		ca, err := pki.LoadOrCreateCA(l.TLSDir(), n, n)
		if err != nil {
			return nil, nil, err
		}
		cas[n] = ca
	}
	swapped := map[string]string{} // old certificate PEM → name
	var done []Rotated
	for _, name := range names {
		dir, base := l.TLSDir(), name
		if b, ok := strings.CutPrefix(name, "agent/"); ok {
			dir, base = l.AgentTLSDir(), b
		}
		certPath := filepath.Join(dir, base+".crt")
		old, err := load(certPath)
		if errors.Is(err, os.ErrNotExist) {
			continue // not issued on this machine (yet): the next start issues it
		} else if err != nil {
			return done, nil, err
		}
		var signer *pki.CA
		for _, n := range CAs {
			if old.CheckSignatureFrom(cas[n].Cert) == nil {
				signer = cas[n]
			}
		}
		if signer == nil {
			return done, nil, fmt.Errorf("%s is signed by none of the cluster's CAs; remove it and start the server to issue a new one", certPath)
		}
		oldPEM, _ := os.ReadFile(certPath)
		spec := pki.LeafSpec{CommonName: old.Subject.CommonName, Organization: old.Subject.Organization,
			DNSNames: old.DNSNames, IPs: old.IPAddresses,
			Client: slices.Contains(old.ExtKeyUsage, x509.ExtKeyUsageClientAuth),
			Server: slices.Contains(old.ExtKeyUsage, x509.ExtKeyUsageServerAuth)}
		if err := os.Remove(certPath); err != nil {
			return done, nil, err
		}
		if _, err := signer.Ensure(dir, base, spec); err != nil {
			return done, nil, err
		}
		cert, err := load(certPath)
		if err != nil {
			return done, nil, err
		}
		swapped[string(oldPEM)] = name
		done = append(done, Rotated{Name: name, OldNotAfter: old.NotAfter, NotAfter: cert.NotAfter})
	}
	kubeconfigs, err := rewriteKubeconfigs(l, swapped)
	return done, kubeconfigs, err
}

// rewriteKubeconfigs replaces, in every kubeconfig of the data dir, the
// embedded client certificates that were rotated, and returns the files changed.
func rewriteKubeconfigs(l datadir.Layout, swapped map[string]string) ([]string, error) {
	if len(swapped) == 0 {
		return nil, nil
	}
	files := []string{l.AdminKubeconfig(), l.NodeKubeconfig(), l.LocalPathKubeconfig()}
	more, _ := filepath.Glob(filepath.Join(l.CredDir(), "*.kubeconfig"))
	files = append(files, more...)
	var changed []string
	for _, f := range files {
		cfg, err := clientcmd.LoadFromFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		} else if err != nil {
			return changed, fmt.Errorf("%s: %w", f, err)
		}
		dirty := false
		for _, ai := range cfg.AuthInfos {
			name, ok := swapped[string(ai.ClientCertificateData)]
			if !ok {
				continue
			}
			dir, base := l.TLSDir(), name
			if b, ok := strings.CutPrefix(name, "agent/"); ok {
				dir, base = l.AgentTLSDir(), b
			}
			cert, err := os.ReadFile(filepath.Join(dir, base+".crt"))
			if err != nil {
				return changed, err
			}
			key, err := os.ReadFile(filepath.Join(dir, base+".key"))
			if err != nil {
				return changed, err
			}
			ai.ClientCertificateData, ai.ClientKeyData = cert, key
			dirty = true
		}
		if !dirty {
			continue
		}
		data, err := clientcmd.Write(*cfg)
		if err != nil {
			return changed, err
		}
		if err := pki.WriteFile(f, data); err != nil {
			return changed, err
		}
		changed = append(changed, f)
	}
	return changed, nil
}
