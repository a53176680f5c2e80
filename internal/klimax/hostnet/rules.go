// Package hostnet owns the layer-3 plumbing between the host and the kind
// bridge: the host route for the bridge CIDR via the VM (macOS `route`, Linux
// `ip route`), and, inside the VM, the no-SNAT iptables rules that keep
// source addresses intact between the host and the clusters, persisted by a
// systemd oneshot and a docker.service drop-in. Status checks look for
// exactly what Ensure installs.
package hostnet

import (
	"bytes"
	"context"
	"embed"
	"encoding/base64"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"text/template"
	"time"

	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

//go:embed templates/*.tmpl
var templates embed.FS

var tmpl = template.Must(template.New("").Funcs(template.FuncMap{
	"b64": func(b []byte) string { return base64.StdEncoding.EncodeToString(b) },
}).ParseFS(templates, "templates/*.tmpl"))

// RuleComment tags every iptables rule klimax installs.
const RuleComment = "klimax-nosnat"

// Guest paths of the persisted rules.
const (
	ScriptPath = "/usr/local/sbin/klimax-nosnat"
	UnitPath   = "/etc/systemd/system/klimax-nosnat.service"
	DropInPath = "/etc/systemd/system/docker.service.d/10-klimax-nosnat.conf"
)

// RuleSpec is the validated input of the no-SNAT rules.
type RuleSpec struct {
	// BridgeCIDR is the kind bridge network (network.kindBridgeCIDR).
	BridgeCIDR netip.Prefix
	// VMIface is the guest interface facing the host (lima0).
	VMIface string
}

var ifaceRe = regexp.MustCompile(`^[a-z][a-z0-9]{0,14}$`)

// Validate refuses anything that is not a plain IPv4 network and interface
// name, since both reach a root shell.
func (s RuleSpec) Validate() error {
	if !s.BridgeCIDR.IsValid() || !s.BridgeCIDR.Addr().Is4() || s.BridgeCIDR.Masked() != s.BridgeCIDR {
		return fmt.Errorf("network.kindBridgeCIDR %q is not an IPv4 network address (fix: use e.g. 172.30.0.0/16)", s.BridgeCIDR)
	}
	if !ifaceRe.MatchString(s.VMIface) {
		return fmt.Errorf("VM interface %q is not a valid interface name (fix: use e.g. lima0)", s.VMIface)
	}
	return nil
}

// Rule is one iptables rule, in the exact form `iptables -S` prints it.
type Rule struct {
	Table string // nat or filter
	Chain string
	Args  []string // after "-A <chain>"
}

// String is the rule as `iptables -t <table> -S <chain>` prints it.
func (r Rule) String() string { return "-A " + r.Chain + " " + strings.Join(r.Args, " ") }

// Rules are the two rules for a VM-side network vmNet (the host's side of
// vzNAT, read from the guest at run time):
//   - nat POSTROUTING: kind -> VM network leaving on the VM interface is
//     accepted before Docker's MASQUERADE, so the host sees pod/node IPs;
//   - filter DOCKER-USER: host -> kind arriving on the VM interface is
//     accepted (Docker would otherwise drop forwarded traffic).
func Rules(spec RuleSpec, vmNet netip.Prefix) []Rule {
	b, v := spec.BridgeCIDR.String(), vmNet.Masked().String()
	tag := []string{"-m", "comment", "--comment", RuleComment, "-j", "ACCEPT"}
	return []Rule{
		{Table: "nat", Chain: "POSTROUTING", Args: append([]string{"-s", b, "-d", v, "-o", spec.VMIface}, tag...)},
		{Table: "filter", Chain: "DOCKER-USER", Args: append([]string{"-s", v, "-d", b, "-i", spec.VMIface}, tag...)},
	}
}

type scriptData struct {
	Bridge, Iface, Comment, Script, Unit, DropIn string
	ScriptB64, UnitB64, DropInB64                string
}

func (s RuleSpec) data() scriptData {
	return scriptData{Bridge: s.BridgeCIDR.String(), Iface: s.VMIface, Comment: RuleComment,
		Script: ScriptPath, Unit: UnitPath, DropIn: DropInPath}
}

func render(name string, data any) ([]byte, error) {
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, name, data); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// RenderRulesScript renders /usr/local/sbin/klimax-nosnat: it reads the VM
// network from the interface at run time (the vzNAT address is dynamic),
// removes every rule tagged klimax-nosnat and inserts the current ones
// first in their chains.
func RenderRulesScript(spec RuleSpec) ([]byte, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	return render("nosnat.sh.tmpl", spec.data())
}

// RenderUnits renders the systemd oneshot (boot) and the docker.service
// drop-in (every Docker (re)start re-creates its chains, so the rules are
// re-applied after it).
func RenderUnits(spec RuleSpec) (unit, dropIn []byte, err error) {
	if err := spec.Validate(); err != nil {
		return nil, nil, err
	}
	if unit, err = render("nosnat.service.tmpl", spec.data()); err != nil {
		return nil, nil, err
	}
	dropIn, err = render("docker-dropin.conf.tmpl", spec.data())
	return unit, dropIn, err
}

// RenderInstaller renders the root script `up` runs (via bash -s) to write
// the files (content passed base64-encoded, so no file text is ever
// interpreted by the shell), enable the oneshot and apply the rules now.
func RenderInstaller(spec RuleSpec) ([]byte, error) {
	script, err := RenderRulesScript(spec)
	if err != nil {
		return nil, err
	}
	unit, dropIn, err := RenderUnits(spec)
	if err != nil {
		return nil, err
	}
	d := spec.data()
	d.ScriptB64 = base64.StdEncoding.EncodeToString(script)
	d.UnitB64 = base64.StdEncoding.EncodeToString(unit)
	d.DropInB64 = base64.StdEncoding.EncodeToString(dropIn)
	return render("install.sh.tmpl", d)
}

// RulesStatus is what CheckRules found in the guest.
type RulesStatus struct {
	VMNet     netip.Prefix `json:"vmNet"`
	Installed bool         `json:"installed"` // script, unit and drop-in match
	Active    bool         `json:"active"`    // both rules present, once, first in chain
	Problems  []string     `json:"problems,omitempty"`
}

// OK reports whether nothing needs doing.
func (s RulesStatus) OK() bool { return s.Installed && s.Active }

const checkTimeout = 30 * time.Second

// CheckRules inspects the guest through r: the VM network of the interface,
// the installed files, and the live rules (present exactly once and first in
// their chain, so Docker's MASQUERADE cannot match before them).
func CheckRules(ctx context.Context, r vm.Runner, spec RuleSpec) (RulesStatus, error) {
	var st RulesStatus
	if err := spec.Validate(); err != nil {
		return st, err
	}
	res, err := r.Run(ctx, []string{"ip", "-4", "-j", "addr", "show", "dev", spec.VMIface}, vm.RunOptions{Timeout: checkTimeout})
	if err != nil {
		return st, fmt.Errorf("read %s address: %w", spec.VMIface, err)
	}
	p, err := vm.ParseIfacePrefix(res.Stdout, spec.VMIface)
	if err != nil {
		return st, err
	}
	st.VMNet = p.Masked()

	script, err := RenderRulesScript(spec)
	if err != nil {
		return st, err
	}
	unit, dropIn, err := RenderUnits(spec)
	if err != nil {
		return st, err
	}
	st.Installed = true
	for _, f := range []struct {
		path string
		want []byte
	}{{ScriptPath, script}, {UnitPath, unit}, {DropInPath, dropIn}} {
		res, err := r.Run(ctx, []string{"cat", f.path}, vm.RunOptions{Timeout: checkTimeout, Root: true})
		if err != nil || !bytes.Equal(res.Stdout, f.want) {
			st.Installed = false
			st.Problems = append(st.Problems, f.path+" is missing or differs")
		}
	}
	res, err = r.Run(ctx, []string{"systemctl", "is-enabled", "klimax-nosnat.service"}, vm.RunOptions{Timeout: checkTimeout})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "enabled" {
		st.Installed = false
		st.Problems = append(st.Problems, "klimax-nosnat.service is not enabled")
	}

	st.Active = true
	for _, rule := range Rules(spec, st.VMNet) {
		res, err := r.Run(ctx, []string{"iptables", "-w", "5", "-t", rule.Table, "-S", rule.Chain}, vm.RunOptions{Timeout: checkTimeout, Root: true})
		if err != nil {
			st.Active = false
			st.Problems = append(st.Problems, fmt.Sprintf("cannot list %s %s: %v", rule.Table, rule.Chain, err))
			continue
		}
		if problem := checkChain(string(res.Stdout), rule); problem != "" {
			st.Active = false
			st.Problems = append(st.Problems, problem)
		}
	}
	return st, nil
}

// checkChain verifies that `iptables -S <chain>` output holds rule exactly
// once, as the chain's first rule, and no stale klimax rule.
func checkChain(out string, rule Rule) string {
	want := rule.String()
	var rules []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "-A ") {
			rules = append(rules, line)
		}
	}
	count, first := 0, -1
	for i, l := range rules {
		if l == want {
			count++
			if first < 0 {
				first = i
			}
		} else if strings.Contains(l, "--comment "+RuleComment) {
			return fmt.Sprintf("%s %s has a stale klimax rule: %s", rule.Table, rule.Chain, l)
		}
	}
	switch {
	case count == 0:
		return fmt.Sprintf("%s %s lacks rule: %s", rule.Table, rule.Chain, want)
	case count > 1:
		return fmt.Sprintf("%s %s has rule %d times: %s", rule.Table, rule.Chain, count, want)
	case first != 0:
		return fmt.Sprintf("%s %s rule is not first (position %d): %s", rule.Table, rule.Chain, first+1, want)
	}
	return ""
}

// EnsureRules installs and applies the rules unless CheckRules finds them
// exactly right. It reports whether it changed anything.
func EnsureRules(ctx context.Context, r vm.Runner, spec RuleSpec) (bool, error) {
	st, err := CheckRules(ctx, r, spec)
	if err != nil {
		return false, err
	}
	if st.OK() {
		return false, nil
	}
	inst, err := RenderInstaller(spec)
	if err != nil {
		return false, err
	}
	if _, err := r.Run(ctx, []string{"bash", "-s"}, vm.RunOptions{Root: true, Stdin: bytes.NewReader(inst), Timeout: 2 * time.Minute}); err != nil {
		return false, fmt.Errorf("install no-SNAT rules: %w", err)
	}
	st, err = CheckRules(ctx, r, spec)
	if err != nil {
		return true, err
	}
	if !st.OK() {
		return true, fmt.Errorf("no-SNAT rules still not right after install: %s", strings.Join(st.Problems, "; "))
	}
	return true, nil
}
