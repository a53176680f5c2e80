package pod

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// An exec on a terminal (kubectl exec -t) runs under the container's
// profile plus a rule for that one terminal; without one, the profile as
// it is.
func TestEnterAllowsTheExecsTerminal(t *testing.T) {
	dir := t.TempDir()
	b, _ := json.Marshal(sandbox.Attempt{Sandbox: &sandbox.Spec{Seatbelt: "(version 1)\n(deny default)\n"}})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	m := &Manager{}
	argv, _, err := m.enter(false, dir, 0, "/", []string{"sh"}, "/dev/ttys004")
	if err != nil {
		t.Fatal(err)
	}
	if len(argv) != 5 || argv[0] != sandbox.SandboxExec || !strings.Contains(argv[2], `(literal "/dev/ttys004")`) || argv[4] != "sh" {
		t.Errorf("exec on /dev/ttys004: %q", argv)
	}
	argv, _, err = m.enter(false, dir, 0, "/", []string{"sh"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(argv[2], "ttys") {
		t.Errorf("exec without a terminal allows one: %q", argv[2])
	}
	if _, _, err := m.enter(false, dir, 0, "/", []string{"sh"}, "/dev/console"); err == nil {
		t.Error("a terminal that is not a pseudo-terminal was allowed")
	}
}
