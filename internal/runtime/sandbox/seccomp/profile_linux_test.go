package seccomp

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	mobyseccomp "github.com/moby/profiles/seccomp"
	"golang.org/x/sys/unix"
)

func TestForContainerKinds(t *testing.T) {
	def, err := RuntimeDefault()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"", "RuntimeDefault", "runtime/default"} {
		f, err := ForContainer(p, "", DefaultCapabilities)
		if err != nil || !slices.Equal(f, def) {
			t.Errorf("ForContainer(%q): %d instructions, %v; want the runtime default", p, len(f), err)
		}
	}
	f, err := ForContainer("Unconfined", "", DefaultCapabilities)
	if err != nil || f != nil {
		t.Errorf("ForContainer(Unconfined) = %v, %v; want nil, nil", f, err)
	}
	// The cache hands out copies.
	def[0].K = 12345
	if again, _ := RuntimeDefault(); again[0].K == 12345 {
		t.Error("RuntimeDefault returned the cached slice itself")
	}
}

// TestLocalhostDockerFormat compiles a Docker-format profile (archMap,
// includes/excludes): moby's own default, written out as JSON. It is
// taken as written, so MPTCP is not denied, unlike RuntimeDefault.
func TestLocalhostDockerFormat(t *testing.T) {
	dir := t.TempDir()
	b, err := json.Marshal(mobyseccomp.DefaultProfile())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "docker.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := ForContainer("localhost/docker.json", dir, DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []uint64
		want uint32
	}{
		{"read", nil, allow}, {"mount", nil, eperm}, {"chroot", nil, allow}, {"clone3", nil, enosys},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_STREAM, ipprotoMPTCP}, allow},
		{"socket", []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, eperm},
	} {
		if got := run(t, f, auditArch, nr(t, c.name), c.args...); got != c.want {
			t.Errorf("%s(%v) = %#x, want %#x", c.name, c.args, got, c.want)
		}
	}
}

func TestForContainerBadInput(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("broken.json", `{"defaultAction": `)
	write("nodefault.json", `{"syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]}`)
	write("badaction.json", `{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_MAYBE"}]}`)
	write("notify.json", `{"defaultAction": "SCMP_ACT_NOTIFY"}`)
	write("s390.json", `{"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_S390X"]}`)
	write("sub/dir/.keep", "")
	if err := os.WriteFile(filepath.Join(outside, "secret.json"), []byte(`{"defaultAction":"SCMP_ACT_ALLOW"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret.json"), filepath.Join(dir, "escape.json")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		profile, dir, want string
	}{
		{"Default", dir, "use RuntimeDefault, Unconfined or Localhost/"},
		{"Localhost/x.json", "", "no seccomp profile directory"},
		{"Localhost/", dir, "must be a relative path"},
		{"Localhost/../secret.json", dir, "must be a relative path"},
		{"Localhost//etc/passwd", dir, "must be a relative path"},
		{"Localhost/escape.json", dir, "must be a regular file inside"},
		{"Localhost/missing.json", dir, "does not exist"},
		{"Localhost/sub/dir", dir, "not a regular file"},
		{"Localhost/broken.json", dir, "not valid JSON"},
		{"Localhost/nodefault.json", dir, "no defaultAction"},
		{"Localhost/badaction.json", dir, `syscalls[0] (read): unknown action "SCMP_ACT_MAYBE"`},
		{"Localhost/notify.json", dir, "seccomp agent"},
		{"Localhost/s390.json", dir, "do not include"},
	} {
		_, err := ForContainer(c.profile, c.dir, DefaultCapabilities)
		t.Logf("%s: %v", c.profile, err)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "securityContext.seccompProfile: ") {
			t.Errorf("ForContainer(%q) = %v, want an error on securityContext.seccompProfile with %q", c.profile, err, c.want)
		}
	}
}

// TestForContainerCapabilities: the container's capabilities decide what
// the default and a Docker-format profile's includes allow.
func TestForContainerCapabilities(t *testing.T) {
	caps := append([]string{"SYS_PTRACE"}, DefaultCapabilities...)
	f, err := ForContainer("RuntimeDefault", "", caps)
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, f, auditArch, nr(t, "ptrace")); got != allow {
		t.Errorf("ptrace with CAP_SYS_PTRACE = %#x, want ALLOW", got)
	}
	dir := t.TempDir()
	b, err := json.Marshal(mobyseccomp.DefaultProfile())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "docker.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		caps []string
		want uint32
	}{{DefaultCapabilities, eperm}, {append([]string{"CAP_SYS_ADMIN"}, DefaultCapabilities...), allow}} {
		f, err := ForContainer("Localhost/docker.json", dir, c.caps)
		if err != nil {
			t.Fatal(err)
		}
		if got := run(t, f, auditArch, nr(t, "mount")); got != c.want {
			t.Errorf("Localhost Docker profile, caps %v: mount = %#x, want %#x", c.caps, got, c.want)
		}
	}
}
