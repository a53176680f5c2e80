package platform

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// TestKindCheck runs the real host runner against PATHs with no kind, the
// pinned kind, another version and something that is not kind.
func TestKindCheck(t *testing.T) {
	fakeKind := func(t *testing.T, script string) {
		dir := t.TempDir()
		if script != "" {
			if err := os.WriteFile(filepath.Join(dir, "kind"), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		t.Setenv("PATH", dir)
	}
	for _, tc := range []struct {
		name, script, status, detail string
	}{
		{"missing", "", Fail, "kind version"},
		{"pinned", "echo kind v0.32.0 go1.25.5 linux/amd64", Pass, "kind v0.32.0"},
		{"other version", "echo kind v0.20.0 go1.20 linux/amd64", Warn, "v0.20.0"},
		{"not kind", "echo hello", Fail, "hello"},
		{"broken", "exit 2", Fail, "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakeKind(t, tc.script)
			c := KindCheck(context.Background(), vm.NewHost(), "v0.32.0")
			if c.Status != tc.status || !strings.Contains(c.Detail, tc.detail) {
				t.Fatalf("%+v, want %s with %q", c, tc.status, tc.detail)
			}
			if c.Status != Pass && !strings.Contains(c.Fix, "sigs.k8s.io/kind@v0.32.0") {
				t.Errorf("fix %q does not say how to install the pinned kind", c.Fix)
			}
		})
	}
}
