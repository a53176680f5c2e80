// Package netdconfig is k3sm-netd's configuration: the paths it serves and
// keeps state on, and the one uid it serves. It is apart from roleconfig
// (which re-exports it as NetdConfig) because the root helper must link
// little code, and roleconfig's other types pull in Kubernetes packages.
package netdconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
)

// Role names k3sm-netd among the roles (roleconfig.Netd).
const Role = "netd"

// Config is what the k3sm server writes for k3sm-netd.
type Config struct {
	// Socket is where netd serves (<data-dir>/run/netd.sock).
	Socket string `json:"socket"`
	// StateFile keeps the node's pod range and the pods' addresses.
	StateFile string `json:"stateFile"`
	// NetNSDir holds the pods' network namespace files.
	NetNSDir string `json:"netnsDir"`
	// AllowedUID is the only uid netd answers: k3sm's own.
	AllowedUID int `json:"allowedUID"`
	// KeyDir (optional) holds the mesh's private keys; empty: mesh-keys
	// beside StateFile.
	KeyDir string `json:"keyDir,omitempty"`
}

// Read parses k3sm-netd's arguments (`--config=<file>`) strictly, as
// roleconfig.Read does for k3sm's own roles.
func Read(args []string) (Config, error) {
	var cfg Config
	fs := flag.NewFlagSet("k3sm-netd", flag.ContinueOnError)
	path := fs.String("config", "", "netd's configuration, written by the k3sm server")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if *path == "" || fs.NArg() > 0 {
		return cfg, errors.New("k3sm-netd is started as `k3sm-netd --config=<file>` with the file the k3sm server writes")
	}
	data, err := os.ReadFile(*path)
	if err != nil {
		return cfg, fmt.Errorf("k3sm-netd: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("k3sm-netd: config %s: %w (was it written by another k3sm version?)", *path, err)
	}
	if dec.More() {
		return cfg, fmt.Errorf("k3sm-netd: config %s: trailing data", *path)
	}
	return cfg, nil
}
