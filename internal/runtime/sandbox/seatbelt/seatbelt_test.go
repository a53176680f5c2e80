package seatbelt

import (
	"regexp"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/golden"
)

const (
	data   = "/private/var/lib/k3sm"
	podDir = data + "/pods/0b5e-uid"
	root   = podDir + "/roots/web"
)

func plain() Pod { return Pod{DataDir: data, PodDir: podDir, Root: root} }

func render(t *testing.T, p Pod) string {
	t.Helper()
	s, err := Profile(p)
	if err != nil {
		t.Fatalf("Profile: %v", err)
	}
	return s
}

func TestProfileGolden(t *testing.T) {
	volumes := plain()
	volumes.Writable = []string{podDir + "/volumes/cache", data + "/storage/pvc-1"}
	volumes.ReadOnly = []string{podDir + "/volumes/config", "/opt/models"}
	volumes.ReadFiles = []string{podDir + "/resolv.conf"}
	volumes.Libraries = []string{"/usr/local/lib/k3sm/libk3sm-dns.dylib"}
	volumes.ReadOnlyRoot = true
	volumes.NoPrivilegeEscalation = true

	network := plain()
	network.Network = true

	odd := plain()
	odd.Root = podDir + `/roots/a "quoted" \ name`
	odd.Writable = []string{"/Users/Jane Doe/Library/k3sm volumes/scratch (1)"}

	for _, c := range []struct {
		name string
		pod  Pod
	}{
		{"plain.sb", plain()},
		{"volumes.sb", volumes},
		{"network.sb", network},
		{"quoted-paths.sb", odd},
	} {
		t.Run(c.name, func(t *testing.T) { golden.Check(t, c.name, []byte(render(t, c.pod))) })
	}
}

// rules is the profile's rules as one line each, in order, comments out.
func rules(profile string) []string {
	out, _ := parseRules(profile)
	return out
}

// parseRules is rules, and unclosed: the text from where the parentheses
// outside string literals stopped balancing (a rule closed too often, or
// one left open at the end), "" when every rule closes.
func parseRules(profile string) (out []string, unclosed string) {
	var cur strings.Builder
	depth := 0
	for _, line := range strings.Split(profile, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), ";") || strings.TrimSpace(line) == "" {
			continue
		}
		if cur.Len() > 0 {
			cur.WriteByte(' ')
		}
		cur.WriteString(strings.TrimSpace(line))
		inStr := false
		for i := 0; i < len(line); i++ {
			switch c := line[i]; {
			case inStr && c == '\\':
				i++
			case c == '"':
				inStr = !inStr
			case !inStr && c == '(':
				depth++
			case !inStr && c == ')':
				depth--
			}
		}
		if depth < 0 {
			return out, cur.String()
		}
		if depth == 0 {
			out = append(out, cur.String())
			cur.Reset()
		}
	}
	return out, cur.String()
}

// decision returns the action of the last rule naming op and filter: SBPL
// applies the last match.
func decision(t *testing.T, profile, op, filter string) string {
	t.Helper()
	last := ""
	for _, r := range rules(profile) {
		fields := strings.Fields(strings.TrimPrefix(r, "("))
		if len(fields) < 2 {
			continue
		}
		ops := ""
		for _, f := range fields[1:] {
			if strings.HasPrefix(f, "(") {
				break
			}
			ops += " " + f + " "
		}
		if strings.Contains(ops, " "+op+" ") && strings.Contains(r, filter) {
			last = fields[0]
		}
	}
	return last
}

func TestProfileDeniesHostAndOtherPods(t *testing.T) {
	p := plain()
	p.Writable = []string{podDir + "/volumes/data"}
	s := render(t, p)
	if !strings.HasPrefix(s, "(version 1)\n") || !strings.Contains(s, "\n(deny default)\n") {
		t.Fatalf("profile does not start default-deny:\n%s", s)
	}
	for _, c := range []struct{ op, filter, want string }{
		{"file-read*", `(subpath "/Users")`, "deny"},
		{"process-exec", `(subpath "/Users")`, "deny"},
		{"file-test-existence", `(subpath "/Users")`, "deny"},
		{"file-test-existence", `(subpath "` + data + `/pods")`, "deny"},
		{"file-test-existence", `(subpath "` + root + `")`, "allow"},
		{"file-read*", `(subpath "/System/Volumes")`, "deny"}, // the data volume's second path
		{"file-read*", `(subpath "/System/Volumes/Preboot/Cryptexes")`, "allow"},
		{"file-read*", `(subpath "` + data + `")`, "deny"},
		{"file-read*", `(subpath "` + data + `/pods")`, "deny"}, // other pods
		{"file-write*", `(subpath "` + data + `/pods")`, "deny"},
		{"file-read*", `(subpath "` + data + `/logs")`, "deny"},
		{"file-read*", `(subpath "` + data + `/run")`, "deny"},
		{"network-outbound", `(remote unix-socket (subpath "` + data + `"))`, "deny"},
		{"file-read*", `(subpath "` + root + `")`, "allow"},
		{"file-write*", `(subpath "` + root + `")`, "allow"},
		{"file-write*", `(subpath "` + podDir + `/volumes/data")`, "allow"},
		{"process-exec", `(literal "/usr/bin/sudo")`, "deny"},
	} {
		if got := decision(t, s, c.op, c.filter); got != c.want {
			t.Errorf("%s %s: last rule is %q, want %q", c.op, c.filter, got, c.want)
		}
	}
	// The own paths come after every deny, so they win over them.
	if strings.Index(s, `(subpath "`+root+`")`) < strings.Index(s, `(subpath "`+data+`/pods")`) {
		t.Error("the container's root is allowed before the pods directory is denied: the deny would win")
	}
	// Nothing allows the pod's directory itself (pod.json holds pull
	// secrets), another container's root, or the data dir as a whole.
	for _, r := range rules(s) {
		if !strings.HasPrefix(r, "(allow") {
			continue
		}
		for _, bad := range []string{`(subpath "` + podDir + `")`, `(subpath "` + podDir + `/roots")`, `(subpath "` + data + `")`, `(literal "` + podDir + `/pod.json")`} {
			if strings.Contains(r, bad) {
				t.Errorf("rule %s allows %s", r, bad)
			}
		}
		if strings.Contains(r, "file-read-data") || strings.Contains(r, "file-read*") {
			for _, f := range regexp.MustCompile(`\((?:subpath|literal) "([^"]*)"\)`).FindAllStringSubmatch(r, -1) {
				if f[1] == "/Users" || strings.HasPrefix(f[1], "/Users/") {
					t.Errorf("rule %s reads under /Users", r)
				}
			}
		}
	}
	// No network without the annotation, not even a rule that names it.
	for _, r := range rules(s) {
		if strings.HasPrefix(r, "(allow") && (strings.Contains(r, "(remote ip") || strings.Contains(r, "(local ip") || r == "(allow system-socket)") {
			t.Errorf("network allowed without opting in: %s", r)
		}
	}
	// Terminals are not allowed in general (another pod's exec session;
	// sandbox.WithTTY adds the one a process runs on).
	if strings.Contains(s, "ttys") {
		t.Error("profile names terminals")
	}
}

func TestProfileReadOnlyRoot(t *testing.T) {
	p := plain()
	p.ReadOnlyRoot = true
	s := render(t, p)
	if got := decision(t, s, "file-write*", `(subpath "`+root+`")`); got != "" {
		t.Errorf("readOnlyRootFilesystem: root has a %s file-write* rule", got)
	}
	if got := decision(t, s, "file-read*", `(subpath "`+root+`")`); got != "allow" {
		t.Errorf("readOnlyRootFilesystem: root not readable (%q)", got)
	}
}

func TestProfileNetworkOptIn(t *testing.T) {
	p := plain()
	p.Network = true
	s := render(t, p)
	for _, want := range []string{"(allow network-outbound (remote ip))", "(allow network-inbound (local ip))", "(allow network-bind (local ip))"} {
		if !strings.Contains(s, want) {
			t.Errorf("network pod lacks %s", want)
		}
	}
	// Still no unix socket of k3sm's: the IP rules do not name them.
	if got := decision(t, s, "network-outbound", `(remote unix-socket (subpath "`+data+`"))`); got != "deny" {
		t.Errorf("k3sm's sockets: %q, want deny", got)
	}
}

func TestProfileQuotesPaths(t *testing.T) {
	p := plain()
	p.Root = podDir + `/roots/x"y\z`
	s := render(t, p)
	if !strings.Contains(s, `(subpath "`+podDir+`/roots/x\"y\\z")`) {
		t.Errorf("path not escaped:\n%s", s)
	}
	// Every string literal closes where it should: balanced parentheses
	// outside strings, line by line of rules.
	rs, unclosed := parseRules(s)
	if unclosed != "" {
		t.Errorf("parentheses outside strings do not balance from: %s", unclosed)
	}
	for _, r := range rs {
		if !strings.HasSuffix(r, ")") {
			t.Errorf("rule does not close: %s", r)
		}
	}
}

func TestProfileRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*Pod)
		want string
	}{
		{"no data dir", func(p *Pod) { p.DataDir = "" }, "Pod.DataDir is required"},
		{"relative root", func(p *Pod) { p.Root = "roots/web" }, "not absolute"},
		{"unclean", func(p *Pod) { p.Writable = []string{podDir + "/volumes/../volumes/a"} }, "not clean"},
		{"newline", func(p *Pod) { p.ReadOnly = []string{"/opt/a\nb"} }, "control character"},
		{"bad utf-8", func(p *Pod) { p.ReadOnly = []string{"/opt/\xff"} }, "not valid UTF-8"},
		{"root outside pod", func(p *Pod) { p.Root = "/tmp/web" }, "is not a container root"},
		{"pod dir elsewhere", func(p *Pod) { p.PodDir = "/tmp/pods/x" }, "is not a pod directory"},
		{"another pod", func(p *Pod) { p.ReadOnly = []string{data + "/pods/other/volumes/v"} }, "inside k3sm's data dir"},
		{"own pod.json", func(p *Pod) { p.ReadFiles = []string{podDir + "/pod.json"} }, "inside k3sm's data dir"},
		{"logs", func(p *Pod) { p.Writable = []string{data + "/logs"} }, "inside k3sm's data dir"},
		{"contains data dir", func(p *Pod) { p.Writable = []string{"/private/var"} }, "contains k3sm's data dir"},
		{"host root", func(p *Pod) { p.ReadOnly = []string{"/"} }, "contains k3sm's data dir"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := plain()
			c.edit(&p)
			_, err := Profile(p)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}

func TestNetworkFromAnnotations(t *testing.T) {
	for _, c := range []struct {
		ann  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"other": "allow"}, false},
		{map[string]string{NetworkAnnotation: "allow"}, true},
		{map[string]string{NetworkAnnotation: "deny"}, false},
	} {
		got, err := NetworkFromAnnotations(c.ann)
		if err != nil || got != c.want {
			t.Errorf("%v: %v, %v; want %v", c.ann, got, err, c.want)
		}
	}
	_, err := NetworkFromAnnotations(map[string]string{NetworkAnnotation: "yes"})
	if err == nil || !strings.Contains(err.Error(), NetworkAnnotation) || !strings.Contains(err.Error(), `"yes"`) {
		t.Errorf("bad value: %v, want an error naming the annotation and the value", err)
	}
}
