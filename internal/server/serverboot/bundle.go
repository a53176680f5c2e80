package serverboot

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
)

// SharedFiles are the files every server of a cluster holds alike, by
// path under the data directory: the three CAs (certificate and key), the
// service-account signing key and, when the cluster encrypts Secrets, its
// encryption configuration, and with embedded etcd its etcd CA. Every other certificate is issued by each
// server from these.
func SharedFiles(l datadir.Layout) []string {
	var abs []string
	for _, ca := range []string{"server-ca", "client-ca", "request-header-ca"} {
		abs = append(abs, l.TLS(ca+".crt"), l.TLS(ca+".key"))
	}
	abs = append(abs, l.ServiceAccountKey(), l.EncryptionConfig(), l.TLS(EtcdCA+".crt"), l.TLS(EtcdCA+".key"))
	rel := make([]string, len(abs))
	for i, p := range abs {
		r, err := filepath.Rel(l.Root, p)
		if err != nil {
			panic(err) // every path is under l.Root
		}
		rel[i] = filepath.ToSlash(r)
	}
	return rel
}

// EtcdCA is the file name (without .crt/.key) of the CA of a cluster's
// embedded etcd: its members' serving and peer certificates and the
// apiservers' client certificates.
const EtcdCA = "etcd-ca"

// optional are the shared files a cluster may lack: the encryption
// configuration, and the etcd CA of a cluster without embedded etcd.
func optional(l datadir.Layout, rel string) bool {
	p := filepath.Join(l.Root, rel)
	return p == l.EncryptionConfig() || p == l.TLS(EtcdCA+".crt") || p == l.TLS(EtcdCA+".key")
}

// Collect reads l's shared files into a bundle with the cluster's
// settings.
func Collect(l datadir.Layout, settings map[string]string) (Bundle, error) {
	b := Bundle{Files: map[string][]byte{}, Settings: settings}
	for _, rel := range SharedFiles(l) {
		data, err := os.ReadFile(filepath.Join(l.Root, rel))
		if errors.Is(err, os.ErrNotExist) && optional(l, rel) {
			continue
		}
		if err != nil {
			return Bundle{}, err
		}
		b.Files[rel] = data
	}
	return b, nil
}

// Encrypted reports whether the bundle's cluster encrypts Secrets at rest.
func (b Bundle) Encrypted(l datadir.Layout) bool {
	rel, _ := filepath.Rel(l.Root, l.EncryptionConfig())
	_, ok := b.Files[filepath.ToSlash(rel)]
	return ok
}

// Install writes the bundle's files into l (0600, directories 0700). It
// writes only the shared files: a record naming any other path is refused.
func (b Bundle) Install(l datadir.Layout) error {
	known := SharedFiles(l)
	names := make([]string, 0, len(b.Files))
	for rel := range b.Files {
		if !slices.Contains(known, rel) {
			return fmt.Errorf("the bootstrap record holds %q, which is not a file servers share; it was not written by k3sm", rel)
		}
		names = append(names, rel)
	}
	for _, rel := range known {
		if _, ok := b.Files[rel]; !ok && !optional(l, rel) {
			return fmt.Errorf("the bootstrap record lacks %s", rel)
		}
	}
	sort.Strings(names)
	for _, rel := range names {
		p := filepath.Join(l.Root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		if err := atomicfile.WriteFile(p, b.Files[rel], 0o600); err != nil {
			return err
		}
	}
	return nil
}

// Same reports whether l already holds exactly the bundle's files (a
// server restarted after its join).
func (b Bundle) Same(l datadir.Layout) bool {
	for rel, data := range b.Files {
		have, err := os.ReadFile(filepath.Join(l.Root, rel))
		if err != nil || !bytes.Equal(have, data) {
			return false
		}
	}
	return true
}

// CheckSettings refuses settings that differ from the cluster's: a server
// with another --service-cidr would hand out addresses the others route
// elsewhere. Each difference names its flag and the cluster's value.
func CheckSettings(b Bundle, mine map[string]string) error {
	flags := make([]string, 0, len(b.Settings))
	for f := range b.Settings {
		flags = append(flags, f)
	}
	sort.Strings(flags)
	var errs []error
	for _, f := range flags {
		if v, ok := mine[f]; ok && v != b.Settings[f] {
			errs = append(errs, &datastore.FieldError{Flag: f, Value: v,
				Problem: fmt.Sprintf("the cluster's servers run with %q", b.Settings[f]),
				Fix:     fmt.Sprintf("give --%s=%s (every server of a cluster must agree); nothing was started", f, b.Settings[f])})
		}
	}
	return errors.Join(errs...)
}
