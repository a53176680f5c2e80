package install

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/roleconfig/netdconfig"
)

// launchd labels; `k3sm status` looks for /Library/LaunchDaemons/<label>.plist.
const (
	LabelServer  = "dev.k3sm.server"
	LabelAgent   = "dev.k3sm.agent"
	LabelNetd    = "dev.k3sm.netd"
	LabelDataVol = "dev.k3sm.datavol"
	// ServiceUser is the unprivileged user the server runs as on macOS.
	ServiceUser = "_k3sm"
)

// Launchd renders the macOS service of the design: a root LaunchDaemon for
// k3sm-netd, one for the server as _k3sm, and, when the data dir is its own
// APFS volume, a root one that mounts it at boot.
type Launchd struct {
	// UID is the _k3sm user's (and group's) id, chosen free below 500 by
	// the caller; UserExists skips creating it.
	UID        int
	UserExists bool
}

func (Launchd) Name() string { return "launchd" }

// Available: launchd is always macOS's init.
func (Launchd) Available() error { return nil }

func (Launchd) logDir(o Options) string {
	if o.LogDir != "" {
		return o.LogDir
	}
	return "/var/log/k3sm"
}

func plistPath(o Options, label string) string {
	return filepath.Join(o.unitDir("/Library/LaunchDaemons"), label+".plist")
}

// UnitName is the role's label: dev.k3sm.server or dev.k3sm.agent.
func (Launchd) UnitName(o Options) string {
	if o.role() == RoleAgent {
		return LabelAgent
	}
	return LabelServer
}

func (l Launchd) labels(o Options) []string {
	ls := []string{}
	if o.DataVolume != "" {
		ls = append(ls, LabelDataVol)
	}
	return append(ls, LabelNetd, l.UnitName(o))
}

func (l Launchd) Units(o Options) ([]File, error) {
	logs := l.logDir(o)
	var files []File
	add := func(label string, d plistDict) error {
		b, err := d.render()
		if err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
		mode := uint32(0o644)
		if label == l.UnitName(o) && len(o.Environment) > 0 {
			mode = 0o600 // it holds Options.Environment's secrets
		}
		files = append(files, File{Path: plistPath(o, label), Mode: mode, Content: b})
		return nil
	}
	if o.DataVolume != "" {
		if err := add(LabelDataVol, plistDict{
			{"Label", LabelDataVol},
			{"ProgramArguments", []string{"/usr/sbin/diskutil", "mount", "-mountPoint", o.DataDir, o.DataVolume}},
			{"RunAtLoad", true},
			{"StandardErrorPath", filepath.Join(logs, "datavol.log")},
		}); err != nil {
			return nil, err
		}
	}
	// netd reads the configuration the server writes when it starts (the
	// socket, its state and the uid it serves); until then it exits and
	// launchd starts it again.
	netdArgs := []string{filepath.Join(o.libDir(), "k3sm-netd"), "--config=" + datadir.New(o.DataDir).RoleConfig(netdconfig.Role)}
	if err := add(LabelNetd, plistDict{
		{"Label", LabelNetd},
		{"ProgramArguments", netdArgs},
		{"RunAtLoad", true},
		{"KeepAlive", true},
		{"ThrottleInterval", 5},
		{"StandardOutPath", filepath.Join(logs, "netd.log")},
		{"StandardErrorPath", filepath.Join(logs, "netd.log")},
	}); err != nil {
		return nil, err
	}
	server := append([]string{filepath.Join(o.libDir(), binK3sm), o.role(), "--data-dir", o.DataDir}, o.ServerArgs...)
	env := plistDict{{"HOME", o.DataDir}}
	for _, kv := range o.Environment {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, struct {
			Key   string
			Value any
		}{k, v})
	}
	label, log := l.UnitName(o), filepath.Join(logs, o.role()+".log")
	if err := add(label, plistDict{
		{"Label", label},
		{"ProgramArguments", server},
		{"UserName", ServiceUser},
		{"GroupName", ServiceUser},
		{"RunAtLoad", true},
		{"KeepAlive", true},
		// launchd's KillMode=process: pods' shims outlive a stop of the server.
		{"AbandonProcessGroup", true},
		{"ExitTimeOut", 90},
		{"SoftResourceLimits", plistDict{{"NumberOfFiles", 1048576}}},
		{"HardResourceLimits", plistDict{{"NumberOfFiles", 1048576}}},
		{"EnvironmentVariables", env},
		{"StandardOutPath", log},
		{"StandardErrorPath", log},
	}); err != nil {
		return nil, err
	}
	return files, nil
}

func (l Launchd) Setup(o Options) [][]string {
	var cmds [][]string
	if !l.UserExists {
		id := strconv.Itoa(l.UID)
		g, u := "/Groups/"+ServiceUser, "/Users/"+ServiceUser
		cmds = append(cmds,
			[]string{"dscl", ".", "-create", g},
			[]string{"dscl", ".", "-create", g, "PrimaryGroupID", id},
			[]string{"dscl", ".", "-create", g, "RealName", "k3sm"},
			[]string{"dscl", ".", "-create", g, "Password", "*"},
			[]string{"dscl", ".", "-create", u},
			[]string{"dscl", ".", "-create", u, "UniqueID", id},
			[]string{"dscl", ".", "-create", u, "PrimaryGroupID", id},
			[]string{"dscl", ".", "-create", u, "RealName", "k3sm"},
			[]string{"dscl", ".", "-create", u, "UserShell", "/usr/bin/false"},
			[]string{"dscl", ".", "-create", u, "NFSHomeDirectory", "/var/empty"},
			[]string{"dscl", ".", "-create", u, "Password", "*"},
			[]string{"dscl", ".", "-create", u, "IsHidden", "1"},
		)
	}
	return append(cmds,
		[]string{"mkdir", "-p", o.DataDir, l.logDir(o)},
		[]string{"chown", "-R", ServiceUser + ":" + ServiceUser, o.DataDir, l.logDir(o)},
		[]string{"chmod", "0700", o.DataDir},
	)
}

func (l Launchd) Start(o Options, restart bool) [][]string {
	var cmds [][]string
	for _, label := range l.labels(o) {
		if restart {
			// bootstrap refuses a loaded label; bootout of an unloaded one
			// only fails, which Install ignores for "-" commands.
			cmds = append(cmds, []string{"-", "launchctl", "bootout", "system/" + label})
		}
		cmds = append(cmds,
			[]string{"launchctl", "enable", "system/" + label},
			[]string{"launchctl", "bootstrap", "system", plistPath(o, label)})
	}
	return cmds
}

func (l Launchd) Stop(o Options) [][]string {
	ls := l.labels(o)
	var cmds [][]string
	for i := len(ls) - 1; i >= 0; i-- {
		cmds = append(cmds, []string{"launchctl", "bootout", "system/" + ls[i]})
	}
	return cmds
}

func (Launchd) Teardown(_ Options, m *Manifest) [][]string {
	if m == nil || !m.CreatedUser {
		return nil
	}
	return [][]string{
		{"dscl", ".", "-delete", "/Users/" + ServiceUser},
		{"dscl", ".", "-delete", "/Groups/" + ServiceUser},
	}
}

func (l Launchd) ActiveCommand(o Options) []string {
	return []string{"launchctl", "print", "system/" + l.UnitName(o)}
}

func (l Launchd) LogHint(o Options) string {
	return filepath.Join(l.logDir(o), o.role()+".log")
}

// plistDict is an ordered property-list dictionary: values are string,
// bool, int, []string or plistDict.
type plistDict []struct {
	Key   string
	Value any
}

func (d plistDict) render() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(xml.Header)
	b.WriteString(`<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">` + "\n")
	b.WriteString(`<plist version="1.0">` + "\n")
	if err := d.write(&b, ""); err != nil {
		return nil, err
	}
	b.WriteString("</plist>\n")
	return b.Bytes(), nil
}

func (d plistDict) write(b *bytes.Buffer, indent string) error {
	b.WriteString(indent + "<dict>\n")
	in := indent + "\t"
	for _, kv := range d {
		b.WriteString(in + "<key>" + esc(kv.Key) + "</key>\n")
		switch v := kv.Value.(type) {
		case string:
			b.WriteString(in + "<string>" + esc(v) + "</string>\n")
		case bool:
			if v {
				b.WriteString(in + "<true/>\n")
			} else {
				b.WriteString(in + "<false/>\n")
			}
		case int:
			b.WriteString(in + "<integer>" + strconv.Itoa(v) + "</integer>\n")
		case []string:
			b.WriteString(in + "<array>\n")
			for _, s := range v {
				b.WriteString(in + "\t<string>" + esc(s) + "</string>\n")
			}
			b.WriteString(in + "</array>\n")
		case plistDict:
			if err := v.write(b, in); err != nil {
				return err
			}
		default:
			return fmt.Errorf("plist key %s: unsupported value %T", kv.Key, v)
		}
	}
	b.WriteString(indent + "</dict>\n")
	return nil
}

func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
