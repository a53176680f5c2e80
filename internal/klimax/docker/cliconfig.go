package docker

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

// EnvLines returns the POSIX shell lines `klimax docker-env` prints: they
// point the docker CLI at dockerHost, or undo that with unset.
func EnvLines(dockerHost string, unset bool) string {
	if unset {
		return "unset DOCKER_HOST\n"
	}
	return "export DOCKER_HOST=" + shellQuote(dockerHost) + "\n"
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._:-+@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// CLIConfigDir is the docker CLI's configuration directory ($DOCKER_CONFIG
// or ~/.docker).
func CLIConfigDir() string {
	if d := os.Getenv("DOCKER_CONFIG"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".docker")
}

// ContextStore writes Docker CLI contexts in the CLI's own on-disk format:
// <dir>/contexts/meta/<sha256(name)>/meta.json, and the current context in
// <dir>/config.json (other keys of config.json are preserved).
type ContextStore struct {
	Dir string
}

type contextMeta struct {
	Name      string                     `json:"Name"`
	Metadata  contextMetadata            `json:"Metadata"`
	Endpoints map[string]contextEndpoint `json:"Endpoints"`
}

type contextMetadata struct {
	Description string `json:"Description,omitempty"`
}

type contextEndpoint struct {
	Host          string `json:"Host"`
	SkipTLSVerify bool   `json:"SkipTLSVerify"`
}

func (s ContextStore) metaDir(name string) string {
	sum := sha256.Sum256([]byte(name))
	return filepath.Join(s.Dir, "contexts", "meta", hex.EncodeToString(sum[:]))
}

// Set creates or updates context name to reach dockerHost and makes it the
// current context.
func (s ContextStore) Set(name, dockerHost, description string) error {
	if name == "" || name == "default" || strings.ContainsAny(name, "/\\ ") {
		return fmt.Errorf("docker context name %q is not usable", name)
	}
	// Refuse before writing anything when config.json is unusable.
	if _, err := s.readConfig(); err != nil {
		return err
	}
	data, err := json.Marshal(contextMeta{
		Name:      name,
		Metadata:  contextMetadata{Description: description},
		Endpoints: map[string]contextEndpoint{"docker": {Host: dockerHost}},
	})
	if err != nil {
		return err
	}
	dir := s.metaDir(name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, "meta.json"), data, 0o644); err != nil {
		return err
	}
	return s.setCurrent(func(cur string) (string, bool) { return name, cur != name })
}

// Unset switches away from context name (back to the default) if it is
// current and deletes it. It reports whether anything was removed.
func (s ContextStore) Unset(name string) (bool, error) {
	if err := s.setCurrent(func(cur string) (string, bool) { return "", cur == name }); err != nil {
		return false, err
	}
	dir := s.metaDir(name)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return false, err
	}
	os.RemoveAll(filepath.Join(s.Dir, "contexts", "tls", filepath.Base(dir)))
	return true, nil
}

// Get returns the host of context name, or "" when it does not exist.
func (s ContextStore) Get(name string) (string, error) {
	data, err := os.ReadFile(filepath.Join(s.metaDir(name), "meta.json"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var m contextMeta
	if err := json.Unmarshal(data, &m); err != nil {
		return "", fmt.Errorf("docker context %s: %w", name, err)
	}
	return m.Endpoints["docker"].Host, nil
}

// Current returns the CLI's current context ("" = default).
func (s ContextStore) Current() (string, error) {
	cfg, err := s.readConfig()
	if err != nil {
		return "", err
	}
	var cur string
	if raw, ok := cfg["currentContext"]; ok {
		_ = json.Unmarshal(raw, &cur)
	}
	return cur, nil
}

func (s ContextStore) readConfig() (map[string]json.RawMessage, error) {
	path := filepath.Join(s.Dir, "config.json")
	data, err := os.ReadFile(path)
	cfg := map[string]json.RawMessage{}
	if errors.Is(err, os.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return nil, err
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return cfg, nil
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%s is not valid JSON (fix it by hand; klimax leaves it untouched): %w", path, err)
	}
	return cfg, nil
}

// setCurrent edits currentContext in config.json, keeping every other key.
func (s ContextStore) setCurrent(decide func(cur string) (next string, change bool)) error {
	cfg, err := s.readConfig()
	if err != nil {
		return err
	}
	var cur string
	if raw, ok := cfg["currentContext"]; ok {
		_ = json.Unmarshal(raw, &cur)
	}
	next, change := decide(cur)
	if !change {
		return nil
	}
	if next == "" {
		delete(cfg, "currentContext")
	} else {
		cfg["currentContext"], _ = json.Marshal(next)
	}
	data, err := json.MarshalIndent(cfg, "", "\t")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(s.Dir, "config.json"), append(data, '\n'), 0o600)
}
