// Package install sets a machine up to run `k3sm server`, or `k3sm agent`
// (Options.Role), at boot (systemd on Linux, launchd on macOS) and takes
// down exactly what it set up. The
// service definitions and the commands that load them are rendered by a
// Service, a pure function of Options, so both platforms are golden-tested
// on any OS; Install and Uninstall run them through a Runner.
package install

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Fixed locations. Binaries live together in LibDir because the server
// finds k3sm-runtimed, k3sm-shim, k3sm-netd and k3sm-helm next to its own
// (resolved) executable; BinLink puts `k3sm` on $PATH.
const (
	LibDir       = "/usr/local/lib/k3sm"
	BinLink      = "/usr/local/bin/k3sm"
	ManifestPath = "/etc/k3sm/install.json"
	// Binaries are the files copied into LibDir, k3sm first.
	binK3sm = "k3sm"
)

// Roles: what the installed service runs (Options.Role, Manifest.Role).
const (
	RoleServer = "server"
	RoleAgent  = "agent"
)

// Binaries are the programs install copies into LibDir.
var Binaries = []string{"k3sm", "k3sm-runtimed", "k3sm-shim", "k3sm-netd", "k3sm-helm"}

// File is one service definition a Service renders.
type File struct {
	Path    string
	Mode    uint32
	Content []byte
}

// Service renders one platform's service manager: its unit files and the
// commands that load, start, stop and unload them.
type Service interface {
	// Name is "systemd" or "launchd".
	Name() string
	// Available says why this machine cannot use the service manager
	// (checked before anything is written).
	Available() error
	// Units are the service definitions for o.
	Units(o Options) ([]File, error)
	// Setup runs after the binaries and units are in place and before
	// Start (darwin: the _k3sm user and its data dir).
	Setup(o Options) [][]string
	// Start loads and starts the units; restart when a unit or binary
	// changed (a running server must pick them up).
	Start(o Options, restart bool) [][]string
	// Stop stops and unloads the units, before they are removed. Commands
	// that fail here are reported, not fatal: a unit may already be stopped.
	Stop(o Options) [][]string
	// Teardown runs after the units are removed.
	Teardown(o Options, m *Manifest) [][]string
	// UnitName is the role's service: its systemd unit or launchd label.
	UnitName(o Options) string
	// ActiveCommand succeeds while the role's unit runs.
	ActiveCommand(o Options) []string
	// LogHint says where the server's log is, for errors.
	LogHint(o Options) string
}

// Runner runs a system command and returns its combined output.
type Runner interface {
	Run(ctx context.Context, argv []string) (string, error)
}

// ExecRunner runs commands for real.
type ExecRunner struct{}

func (ExecRunner) Run(ctx context.Context, argv []string) (string, error) {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// RenderCommands prints commands one per line as sh would run them, for
// golden files and dry runs; a command whose first word is "-" may fail.
func RenderCommands(cmds [][]string) string {
	var b strings.Builder
	for _, c := range cmds {
		tail := ""
		if len(c) > 0 && c[0] == "-" {
			c, tail = c[1:], " || true"
		}
		q := make([]string, len(c))
		for i, a := range c {
			q[i] = shellQuote(a)
		}
		b.WriteString(strings.Join(q, " ") + tail + "\n")
	}
	return b.String()
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
