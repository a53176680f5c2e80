// Package encryption runs secrets encryption at rest for a k3sm cluster:
// the EncryptionConfiguration the apiserver is started with (aescbc with a
// generated 32-byte key, then identity so that Secrets written before remain
// readable), its status read straight from the datastore, and key rotation
// without downtime (add a key first, wait for the apiserver to load it,
// rewrite every Secret, drop the old key).
package encryption

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/kinedb"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"sigs.k8s.io/yaml"
)

// Provider is the encryption provider k3sm configures.
const Provider = "aescbc"

// SecretsKeyPrefix is where the apiserver stores Secrets in kine.
const SecretsKeyPrefix = "/registry/secrets/"

// StoredPrefix is how a value encrypted with key name starts in the datastore.
func StoredPrefix(keyName string) string { return "k8s:enc:" + Provider + ":v1:" + keyName + ":" }

// Key is one aescbc key.
type Key = apiserverv1.Key

// NewKey generates a key named after now.
func NewKey(now time.Time) (Key, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return Key{}, err
	}
	return Key{Name: "k3sm-" + now.UTC().Format("20060102-150405"), Secret: base64.StdEncoding.EncodeToString(secret)}, nil
}

// Marshal renders the configuration: Secrets encrypted with keys[0],
// readable with any of keys, and readable when stored in plaintext.
func Marshal(keys []Key) ([]byte, error) {
	if len(keys) == 0 {
		return nil, errors.New("no encryption key")
	}
	cfg := apiserverv1.EncryptionConfiguration{
		Resources: []apiserverv1.ResourceConfiguration{{
			Resources: []string{"secrets"},
			Providers: []apiserverv1.ProviderConfiguration{
				{AESCBC: &apiserverv1.AESConfiguration{Keys: keys}},
				{Identity: &apiserverv1.IdentityConfiguration{}},
			},
		}},
	}
	cfg.APIVersion, cfg.Kind = "apiserver.config.k8s.io/v1", "EncryptionConfiguration"
	body, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return append([]byte("# Written by k3sm (secrets encryption at rest). Rotate keys with `k3sm secrets-encrypt rotate-keys`;\n"+
		"# losing this file loses every Secret. Snapshots carry a copy.\n"), body...), nil
}

// Write writes the configuration for keys to path (0600, atomically).
func Write(path string, keys []Key) ([]byte, error) {
	data, err := Marshal(keys)
	if err != nil {
		return nil, err
	}
	return data, atomicfile.WriteFile(path, data, 0o600)
}

// Read returns the aescbc keys of the configuration at path, the active
// (encrypting) one first.
func Read(path string) ([]Key, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cfg apiserverv1.EncryptionConfiguration
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, r := range cfg.Resources {
		for _, p := range r.Providers {
			if p.AESCBC != nil && len(p.AESCBC.Keys) > 0 {
				return p.AESCBC.Keys, nil
			}
			return nil, fmt.Errorf("%s: the first provider is not aescbc with keys; k3sm manages only its own configuration", path)
		}
	}
	return nil, fmt.Errorf("%s: no providers", path)
}

// Prepare decides at server start whether the apiserver runs with an
// encryption configuration and returns its path ("" when not). Encryption
// is decided when the cluster is created: a cluster made with it keeps it
// (with or without the flag), a cluster made without it stays so, and
// the flag on such a cluster gets a warning saying so.
func Prepare(l datadir.Layout, flag bool, log *slog.Logger, now time.Time) (string, error) {
	path := l.EncryptionConfig()
	if _, err := os.Stat(path); err == nil {
		keys, err := Read(path)
		if err != nil {
			return "", err
		}
		log.Info("secrets encryption at rest is on", "provider", Provider, "key", keys[0].Name, "config", path)
		return path, nil
	}
	if !flag {
		return "", nil
	}
	if _, err := os.Stat(l.DBFile()); err == nil {
		log.Warn("--secrets-encryption has no effect: it takes effect only on the start that creates the cluster, and the cluster at " +
			l.Root + " was created without it, so its Secrets stay unencrypted at rest. To encrypt Secrets, create a new cluster " +
			"(a new --data-dir) with --secrets-encryption.")
		return "", nil
	}
	key, err := NewKey(now)
	if err != nil {
		return "", err
	}
	if _, err := Write(path, []Key{key}); err != nil {
		return "", err
	}
	log.Info("secrets encryption at rest: on for this new cluster", "provider", Provider, "key", key.Name, "config", path)
	return path, nil
}

// Status is what `k3sm secrets-encrypt status` reports.
type Status struct {
	Enabled   bool     `json:"enabled"`
	Config    string   `json:"config,omitempty"`
	Provider  string   `json:"provider,omitempty"`
	ActiveKey string   `json:"activeKey,omitempty"`
	Keys      []string `json:"keys,omitempty"`
	// Secrets counts the Secrets in the datastore by the key they are
	// encrypted with; "identity" are stored in plaintext, "unknown" with a
	// key the configuration does not have.
	Secrets map[string]int `json:"secrets"`
}

// GetStatus reads the configuration and the datastore of dataDir.
func GetStatus(ctx context.Context, dataDir string) (Status, error) {
	l := datadir.New(dataDir)
	st := Status{Secrets: map[string]int{}}
	keys, err := Read(l.EncryptionConfig())
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return st, err
	default:
		st.Enabled, st.Config, st.Provider, st.ActiveKey = true, l.EncryptionConfig(), Provider, keys[0].Name
		for _, k := range keys {
			st.Keys = append(st.Keys, k.Name)
		}
	}
	byKey, err := CountByKey(ctx, l.DBFile())
	if err != nil {
		return st, err
	}
	known := map[string]bool{}
	for _, k := range st.Keys {
		known[k] = true
	}
	for k, n := range byKey {
		if k != "identity" && !known[k] {
			k = "unknown"
		}
		st.Secrets[k] += n
	}
	return st, nil
}

// CountByKey counts the Secrets in the datastore at dbFile by the name of
// the key they are encrypted with ("identity" for plaintext).
func CountByKey(ctx context.Context, dbFile string) (map[string]int, error) {
	db, err := kinedb.Open(dbFile)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	out := map[string]int{}
	err = db.Latest(ctx, SecretsKeyPrefix, func(_ string, v []byte) error {
		out[KeyOf(v)]++
		return nil
	})
	return out, err
}

// KeyOf is the name of the key a stored value is encrypted with, or
// "identity" when it is not encrypted.
func KeyOf(stored []byte) string {
	rest, ok := bytes.CutPrefix(stored, []byte("k8s:enc:"))
	if !ok {
		return "identity"
	}
	parts := strings.SplitN(string(rest[:min(len(rest), 300)]), ":", 4)
	if len(parts) < 4 {
		return "unknown"
	}
	return parts[2]
}

// ConfigHash is how the apiserver names a loaded configuration in its
// apiserver_encryption_config_controller_last_config_info metric.
func ConfigHash(data []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(data)) }
