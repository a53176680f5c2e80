package install

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// SystemdUnit is the server's unit name; `k3sm status` looks for
// /etc/systemd/system/k3sm.service.
const SystemdUnit = "k3sm.service"

// Systemd renders the Linux service: one unit running `k3sm server` as
// root. The server starts k3sm-netd itself and runtimed enters the pods'
// network namespaces, which needs root until the privilege split (issue
// 13) gives netd a unit of its own and the server an unprivileged user.
type Systemd struct{}

func (Systemd) Name() string { return "systemd" }

// Available: systemd is the init system (sd_booted(3)'s test).
func (Systemd) Available() error {
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		return errors.New("systemd is not running on this machine (no /run/systemd/system): k3sm install needs systemd as init; run `k3sm server` under your own supervisor instead")
	}
	return nil
}

// UnitPath is where the unit is written.
func (Systemd) UnitPath(o Options) string {
	return filepath.Join(o.unitDir("/etc/systemd/system"), SystemdUnit)
}

func (s Systemd) Units(o Options) ([]File, error) {
	argv := append([]string{filepath.Join(o.libDir(), binK3sm), "server", "--data-dir", o.DataDir}, o.ServerArgs...)
	q := make([]string, len(argv))
	for i, a := range argv {
		v, err := systemdQuote(a)
		if err != nil {
			return nil, err
		}
		q[i] = v
	}
	unit := fmt.Sprintf(`# Written by `+"`k3sm install`"+` (k3sm %s): re-run it to change this unit,
# `+"`k3sm uninstall`"+` removes it.
[Unit]
Description=k3sm: Kubernetes in one binary (control plane and this machine's node)
Documentation=https://github.com/k3sm-dev/k3sm/blob/main/docs/operations.md
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
ExecStart=%s
# Pods' shims run in this unit's cgroup and must outlive a stop or restart
# of the server (a restarted server re-attaches to them): systemd signals
# only the main process, which stops its own children.
KillMode=process
# runtimed manages the cgroups below this unit's.
Delegate=yes
Restart=on-failure
RestartSec=5s
# The first start creates the CAs and the datastore.
TimeoutStartSec=5min
# The server stops the apiserver, kine and the node in order.
TimeoutStopSec=90s
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity

[Install]
WantedBy=multi-user.target
`, o.Version, strings.Join(q, " "))
	return []File{{Path: s.UnitPath(o), Mode: 0o644, Content: []byte(unit)}}, nil
}

func (Systemd) Setup(Options) [][]string { return nil }

func (Systemd) Start(_ Options, restart bool) [][]string {
	start := "start"
	if restart {
		// restart also starts a stopped unit; pods survive it (KillMode=process).
		start = "restart"
	}
	return [][]string{
		{"systemctl", "daemon-reload"},
		{"systemctl", "enable", SystemdUnit},
		{"systemctl", start, SystemdUnit},
	}
}

// Stop stops the server, then the pods: with KillMode=process their
// processes stay in the unit's cgroup after the server stopped, and an
// uninstalled k3sm must leave nothing running (SIGTERM first, as the
// kubelet does; Uninstall waits and sends SIGKILL to what is left).
func (Systemd) Stop(Options) [][]string {
	return [][]string{
		{"systemctl", "disable", SystemdUnit},
		{"systemctl", "stop", SystemdUnit},
		{"systemctl", "kill", "--kill-whom=all", "--signal=SIGTERM", SystemdUnit},
	}
}

func (Systemd) Teardown(Options, *Manifest) [][]string {
	return [][]string{
		{"systemctl", "daemon-reload"},
		{"-", "systemctl", "reset-failed", SystemdUnit}, // fails when it never failed
	}
}

func (Systemd) ActiveCommand(Options) []string {
	return []string{"systemctl", "is-active", "--quiet", SystemdUnit}
}

func (Systemd) LogHint(o Options) string {
	return "journalctl -u k3sm (or " + filepath.Join(o.DataDir, "logs", "k3sm.log") + ")"
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
