package controlplane

import (
	"fmt"
	"slices"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/spf13/pflag"
)

// ExtraArgFlags names the server flag that passes extra arguments to each
// upstream component (`--kube-apiserver-arg=NAME=VALUE`, repeatable).
var ExtraArgFlags = map[string]string{
	roleconfig.APIServer:         "kube-apiserver-arg",
	roleconfig.Scheduler:         "kube-scheduler-arg",
	roleconfig.ControllerManager: "kube-controller-manager-arg",
}

// extraArg is one --kube-*-arg: NAME=VALUE sets the flag (replacing k3sm's
// own value of it), NAME alone sets a boolean, NAME+=VALUE appends to k3sm's
// value with a comma (for list flags such as --enable-admission-plugins).
type extraArg struct {
	name, value string
	hasValue    bool
	appendTo    bool
}

func parseExtraArg(s string) (extraArg, error) {
	s = strings.TrimPrefix(s, "--")
	name, value, hasValue := strings.Cut(s, "=")
	// The components parse kube_api_qps as kube-api-qps (WordSepNormalizeFunc).
	a := extraArg{name: strings.ReplaceAll(name, "_", "-"), value: value, hasValue: hasValue}
	if strings.HasSuffix(name, "+") && hasValue {
		a.name, a.appendTo = strings.TrimSuffix(name, "+"), true
	}
	if a.name == "" || strings.HasPrefix(a.name, "-") || strings.ContainsAny(a.name, " \t=+") {
		return extraArg{}, fmt.Errorf("not NAME=VALUE")
	}
	return a, nil
}

func (a extraArg) String() string {
	if !a.hasValue {
		return "--" + a.name
	}
	return "--" + a.name + "=" + a.value
}

// flagName is the name of a --name[=value] argument.
func flagName(arg string) string {
	name, _, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
	return strings.ReplaceAll(name, "_", "-")
}

// withExtraArgs returns k3sm's arguments for a component with the user's
// extra ones applied: a flag the user sets drops k3sm's value of it (or, with
// +=, extends it), and the user's arguments come last, in their order, so a
// list flag the user repeats gets every value.
func withExtraArgs(defaults, extra []string) []string {
	set := map[string]bool{}
	appended := map[string][]string{}
	var parsed []extraArg
	for _, s := range extra {
		a, err := parseExtraArg(s)
		if err != nil { // Validate refused it before anything started.
			continue
		}
		parsed = append(parsed, a)
		if a.appendTo {
			appended[a.name] = append(appended[a.name], a.value)
		} else {
			set[a.name] = true
		}
	}
	out := make([]string, 0, len(defaults)+len(parsed))
	for _, d := range defaults {
		name := flagName(d)
		if set[name] {
			continue
		}
		if vs, ok := appended[name]; ok {
			d += "," + strings.Join(vs, ",")
			delete(appended, name) // extended; what is left k3sm does not set
		}
		out = append(out, d)
	}
	// += of a flag k3sm does not set is a plain setting, before the others.
	var user []string
	for _, a := range parsed {
		switch _, left := appended[a.name]; {
		case !a.appendTo:
			user = append(user, a.String())
		case left:
			out = append(out, "--"+a.name+"="+a.value)
		}
	}
	return append(out, user...)
}

// validateExtraArgs checks the syntax of every --kube-*-arg and, when the
// server knows the component's flags (flags non-nil), that the flag exists,
// so a typo fails before anything starts instead of as a component that
// exits at once.
func (c *Config) validateExtraArgs(add func(flag, value, problem, fix string)) {
	for _, role := range []string{roleconfig.APIServer, roleconfig.Scheduler, roleconfig.ControllerManager} {
		var known *pflag.FlagSet
		if c.ComponentFlags != nil && len(c.ExtraArgs[role]) > 0 {
			known = c.ComponentFlags(role)
		}
		for _, s := range c.ExtraArgs[role] {
			a, err := parseExtraArg(s)
			if err != nil {
				add(ExtraArgFlags[role], s, err.Error(), "pass one flag of "+role+" per --"+ExtraArgFlags[role]+", e.g. v=2 or feature-gates=Foo=true")
				continue
			}
			if known == nil {
				continue
			}
			f := known.Lookup(a.name)
			switch {
			case f == nil:
				add(ExtraArgFlags[role], s, role+" has no flag --"+a.name, "`k3sm "+role+" --help` lists its flags")
			case !a.hasValue && f.NoOptDefVal == "":
				add(ExtraArgFlags[role], s, "--"+a.name+" of "+role+" needs a value", "pass "+a.name+"=VALUE")
			case a.appendTo && f.Value.Type() == "bool":
				add(ExtraArgFlags[role], s, "--"+a.name+" of "+role+" is a boolean, not a list", "pass "+a.name+"=true or "+a.name+"=false")
			}
		}
	}
}

// shareProcessFlags gives each of the scheduler's and controller-manager's
// command lines the process-wide flags (roleconfig.ProcessFlags) the other
// has and it lacks: they run in one process, with one klog and one set of
// feature gates, so a user's --kube-controller-manager-arg=v=4 applies to
// both. validateProcessFlags refuses two different values.
func shareProcessFlags(sched, cm []string) ([]string, []string) {
	of := func(args []string) map[string][]string {
		m := map[string][]string{}
		for _, a := range args {
			if n := flagName(a); slices.Contains(roleconfig.ProcessFlags, n) {
				m[n] = append(m[n], a)
			}
		}
		return m
	}
	s, c := of(sched), of(cm)
	for _, n := range roleconfig.ProcessFlags {
		if len(c[n]) == 0 {
			cm = append(cm, s[n]...)
		}
		if len(s[n]) == 0 {
			sched = append(sched, c[n]...)
		}
	}
	return sched, cm
}

// validateProcessFlags refuses a process-wide flag given to the scheduler
// and the controller-manager with different values: they share a process.
func (c *Config) validateProcessFlags(add func(flag, value, problem, fix string)) {
	values := func(role string) map[string][]string {
		m := map[string][]string{}
		for _, s := range c.ExtraArgs[role] {
			if a, err := parseExtraArg(s); err == nil && slices.Contains(roleconfig.ProcessFlags, a.name) {
				m[a.name] = append(m[a.name], a.String())
			}
		}
		return m
	}
	s, cm := values(roleconfig.Scheduler), values(roleconfig.ControllerManager)
	for _, n := range roleconfig.ProcessFlags {
		if len(s[n]) > 0 && len(cm[n]) > 0 && !slices.Equal(s[n], cm[n]) {
			add(ExtraArgFlags[roleconfig.Scheduler], strings.Join(s[n], " "),
				"kube-scheduler and kube-controller-manager run in one process, with one logger and one set of feature gates, but --"+n+" differs: "+strings.Join(cm[n], " ")+" for kube-controller-manager",
				"give --"+n+" to one of them only (it applies to both), or the same to both")
		}
	}
}
