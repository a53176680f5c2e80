package install

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/roleconfig/netdconfig"
)

// Unit names; `k3sm status` looks for /etc/systemd/system/k3sm.service.
const (
	SystemdUnit     = "k3sm.service"
	SystemdNetdUnit = "k3sm-netd.service"
	// SystemdAgentUnit runs `k3sm agent` (k3s names its agent's the same way).
	SystemdAgentUnit = "k3sm-agent.service"
	// SystemUser is the unprivileged user the server runs as on Linux.
	SystemUser = "k3sm"
	// NetdConfigPath is k3sm-netd's configuration, root's: the uid it
	// serves and the paths it changes are not the server's to choose.
	NetdConfigPath = "/etc/k3sm/netd.json"
	// NetdSocket is where the installed k3sm-netd serves the server.
	NetdSocket = "/run/k3sm/netd.sock"
	// netdStateDir and netdNetNSDir are netd's own (root's): its state
	// and the pods' pinned namespaces, out of the server's reach.
	netdStateDir = "/var/lib/k3sm-netd"
	netdNetNSDir = "/run/k3sm-netd/netns"
	// subIDs is the k3sm user's subordinate range, the ids 1-65535 of its
	// pods (sandbox.RootlessIDs): the one 65536 range a root runtime never
	// gives a pod (its slot 0).
	subIDs = "1073741824-1073807359"
)

// Systemd renders the Linux service of the privilege split: a root unit for
// k3sm-netd, the only privileged process, and one for `k3sm server` (or
// `k3sm agent`, k3sm-agent.service) as the unprivileged user k3sm (with CAP_NET_BIND_SERVICE for the cluster DNS on
// port 53), which uses that netd (--netd-socket) and runs its pods in the
// rootless sandbox with their own network.
type Systemd struct {
	// UID is the k3sm user's (and group's) id, chosen free by the caller;
	// UserExists skips creating it.
	UID        int
	UserExists bool
	// AddSubIDs gives the user its subordinate range (newuidmap is
	// installed and the user has none).
	AddSubIDs bool
}

func (Systemd) Name() string { return "systemd" }

// Available: systemd is the init system (sd_booted(3)'s test).
func (Systemd) Available() error {
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		return errors.New("systemd is not running on this machine (no /run/systemd/system): k3sm install needs systemd as init; run `k3sm server` under your own supervisor instead")
	}
	return nil
}

// UnitName is k3sm.service, or k3sm-agent.service for an agent.
func (Systemd) UnitName(o Options) string {
	if o.role() == RoleAgent {
		return SystemdAgentUnit
	}
	return SystemdUnit
}

// UnitPath is where the role's unit is written.
func (s Systemd) UnitPath(o Options) string {
	return filepath.Join(o.unitDir("/etc/systemd/system"), s.UnitName(o))
}

// EnvPath is the role's environment file (Options.Environment).
func (s Systemd) EnvPath(o Options) string { return s.UnitPath(o) + ".env" }

// netdPaths are the installed netd's configuration file, state directory
// and namespace directory; tests (which set ManifestPath) get them beside
// the manifest.
func netdPaths(o Options) (config, stateDir, netnsDir string) {
	if o.ManifestPath != "" {
		d := filepath.Dir(o.ManifestPath)
		return filepath.Join(d, "netd.json"), filepath.Join(d, "netd-state"), filepath.Join(d, "netd-netns")
	}
	return NetdConfigPath, netdStateDir, netdNetNSDir
}

// NetdConfig is the installed k3sm-netd's configuration.
func (s Systemd) NetdConfig(o Options) netdconfig.Config {
	_, state, netns := netdPaths(o)
	return netdconfig.Config{Socket: NetdSocket, StateFile: filepath.Join(state, "state.json"), NetNSDir: netns, AllowedUID: s.UID}
}

func (s Systemd) Units(o Options) ([]File, error) {
	argv := []string{filepath.Join(o.libDir(), binK3sm), o.role(), "--data-dir", o.DataDir}
	if !slices.Contains(o.ServerArgs, "--pod-network=host") {
		// The pods' network comes from the netd unit.
		argv = append(argv, "--netd-socket", NetdSocket)
	}
	argv = append(argv, o.ServerArgs...)
	q := make([]string, len(argv))
	for i, a := range argv {
		v, err := systemdQuote(a)
		if err != nil {
			return nil, err
		}
		q[i] = v
	}
	var files []File
	envLine := ""
	if len(o.Environment) > 0 {
		env := s.EnvPath(o)
		qenv, err := systemdQuote(env)
		if err != nil {
			return nil, err
		}
		secrets := "the join token"
		if o.role() != RoleAgent {
			// The server's: the datastore endpoint, a joining server's token.
			var keys []string
			for _, kv := range o.Environment {
				k, _, _ := strings.Cut(kv, "=")
				keys = append(keys, "$"+k)
			}
			secrets = strings.Join(keys, ", ")
		}
		envLine = "# Secrets (" + secrets + "), in a file only root reads.\nEnvironmentFile=" + qenv + "\n"
		var b strings.Builder
		for _, kv := range o.Environment {
			k, v, _ := strings.Cut(kv, "=")
			// Double-quoted with \, ", $ and ` escaped: read back verbatim
			// by systemd's shell-like parser, whether or not it expands.
			fmt.Fprintf(&b, "%s=\"%s\"\n", k, strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`, "`", "\\`").Replace(v))
		}
		files = append(files, File{Path: env, Mode: 0o600, Content: []byte(b.String())})
	}
	home, err := systemdQuote(o.DataDir)
	if err != nil {
		return nil, err
	}
	desc, doc, start, stop := "k3sm: Kubernetes in one binary (control plane and this machine's node)", "operations.md",
		"# The first start creates the CAs and the datastore.", "# The server stops the apiserver, kine and the node in order."
	if o.role() == RoleAgent {
		desc, doc = "k3sm agent: this machine as a node of a k3sm server's cluster", "multinode.md"
		start, stop = "# Each start joins again, retrying while the server is away.", "# The agent stops the node and the runtime daemon; pods keep running."
	}
	unit := fmt.Sprintf(`# Written by `+"`k3sm install`"+` (k3sm %s): re-run it to change this unit,
# `+"`k3sm uninstall`"+` removes it.
[Unit]
Description=%s
Documentation=https://github.com/k3sm-dev/k3sm/blob/main/docs/%s
Wants=network-online.target %s
After=network-online.target %s

[Service]
Type=simple
# Not root: k3sm-netd (its own unit) makes every system change.
User=%s
Group=%s
Environment=HOME=%s
%s# The cluster DNS answers on port 53 of its Service address.
AmbientCapabilities=CAP_NET_BIND_SERVICE
ExecStart=%s
# Pods' shims run in this unit's cgroup and must outlive a stop or restart
# of k3sm (a restarted k3sm re-attaches to them): systemd signals only the
# main process, which stops its own children.
KillMode=process
# runtimed manages the cgroups below this unit's.
Delegate=yes
Restart=on-failure
RestartSec=5s
%s
TimeoutStartSec=5min
%s
TimeoutStopSec=90s
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity

[Install]
WantedBy=multi-user.target
`, o.Version, desc, doc, SystemdNetdUnit, SystemdNetdUnit, SystemUser, SystemUser, home, envLine, strings.Join(q, " "), start, stop)
	cfgPath, _, _ := netdPaths(o)
	netdExe, err := systemdQuote(filepath.Join(o.libDir(), "k3sm-netd"))
	if err != nil {
		return nil, err
	}
	netdUnit := fmt.Sprintf(`# Written by `+"`k3sm install`"+` (k3sm %s): re-run it to change this unit,
# `+"`k3sm uninstall`"+` removes it.
[Unit]
Description=k3sm-netd: the root helper of k3sm's pod network (namespaces, links, addresses, nftables)
Documentation=https://github.com/k3sm-dev/k3sm/blob/main/docs/networking.md
Before=%s

[Service]
Type=simple
ExecStart=%s --config=%s
# Pods keep their network while netd restarts; it resyncs from its state.
Restart=always
RestartSec=2s

[Install]
WantedBy=multi-user.target
`, o.Version, s.UnitName(o), netdExe, cfgPath)
	cfg, err := json.MarshalIndent(s.NetdConfig(o), "", "  ")
	if err != nil {
		return nil, err
	}
	return append(files,
		File{Path: cfgPath, Mode: 0o644, Content: append(cfg, '\n')},
		File{Path: filepath.Join(o.unitDir("/etc/systemd/system"), SystemdNetdUnit), Mode: 0o644, Content: []byte(netdUnit)},
		File{Path: s.UnitPath(o), Mode: 0o644, Content: []byte(unit)},
	), nil
}

// Setup makes the k3sm user (and group, of one free id) unless it exists,
// gives it its subordinate range, and the data dir (0700, its own).
func (s Systemd) Setup(o Options) [][]string {
	var cmds [][]string
	id := strconv.Itoa(s.UID)
	if !s.UserExists {
		cmds = append(cmds,
			[]string{"groupadd", "--system", "--gid", id, SystemUser},
			[]string{"useradd", "--system", "--uid", id, "--gid", id, "--no-create-home", "--home-dir", o.DataDir,
				"--shell", "/usr/sbin/nologin", "--comment", "k3sm " + o.role(), SystemUser})
	}
	if s.AddSubIDs {
		cmds = append(cmds, []string{"usermod", "--add-subuids", subIDs, "--add-subgids", subIDs, SystemUser})
	}
	return append(cmds, []string{"install", "-d", "-m", "0700", "-o", SystemUser, "-g", SystemUser, o.DataDir})
}

func (s Systemd) Start(o Options, restart bool) [][]string {
	start := "start"
	if restart {
		// restart also starts a stopped unit; pods survive it (KillMode=process).
		start = "restart"
	}
	return [][]string{
		{"systemctl", "daemon-reload"},
		{"systemctl", "enable", SystemdNetdUnit, s.UnitName(o)},
		{"systemctl", start, SystemdNetdUnit},
		{"systemctl", start, s.UnitName(o)},
	}
}

// Stop stops the server, then the pods: with KillMode=process their
// processes stay in the unit's cgroup after the server stopped, and an
// uninstalled k3sm must leave nothing running (SIGTERM first, as the
// kubelet does; Uninstall waits and sends SIGKILL to what is left); then
// netd (the pods' network goes with uninstall's removal).
func (s Systemd) Stop(o Options) [][]string {
	unit := s.UnitName(o)
	return [][]string{
		{"systemctl", "disable", unit, SystemdNetdUnit},
		{"systemctl", "stop", unit},
		{"systemctl", "kill", "--kill-whom=all", "--signal=SIGTERM", unit},
		{"systemctl", "stop", SystemdNetdUnit},
	}
}

func (s Systemd) Teardown(o Options, m *Manifest) [][]string {
	cmds := [][]string{
		{"systemctl", "daemon-reload"},
		{"-", "systemctl", "reset-failed", s.UnitName(o), SystemdNetdUnit}, // fails when neither failed
	}
	switch {
	case m != nil && m.CreatedUser:
		// Its group and subordinate ranges go with it.
		cmds = append(cmds, []string{"userdel", SystemUser}, []string{"-", "groupdel", SystemUser})
	case m != nil && m.AddedSubIDs:
		cmds = append(cmds, []string{"usermod", "--del-subuids", subIDs, "--del-subgids", subIDs, SystemUser})
	}
	return cmds
}

func (s Systemd) ActiveCommand(o Options) []string {
	return []string{"systemctl", "is-active", "--quiet", s.UnitName(o)}
}

func (s Systemd) LogHint(o Options) string {
	return "journalctl -u " + strings.TrimSuffix(s.UnitName(o), ".service") + " (or " + filepath.Join(o.DataDir, "logs", "k3sm.log") + ")"
}

// systemdQuote quotes one ExecStart word: double quotes when needed,
// backslash before \ and ", and %/$ doubled so systemd expands neither
// specifiers nor variables.
func systemdQuote(s string) (string, error) {
	if strings.ContainsAny(s, "\n\r\x00") {
		return "", fmt.Errorf("argument %q: a newline or NUL cannot be written into a systemd unit", s)
	}
	e := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "%", "%%", "$", "$$").Replace(s)
	if s == "" || strings.ContainsAny(s, " \t'\";\\") {
		return `"` + e + `"`, nil
	}
	return e, nil
}
