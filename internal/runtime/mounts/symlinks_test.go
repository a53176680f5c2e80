package mounts

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestApplySymlinks(t *testing.T) {
	tmp := t.TempDir()
	src := filepath.Join(tmp, "vol")
	os.Mkdir(src, 0o755)
	os.WriteFile(filepath.Join(src, "f"), []byte("v"), 0o644)
	root := filepath.Join(tmp, "root")
	target := filepath.Join(root, "data", "vol")
	ms := []Mount{{Source: src, Target: target}}
	if err := applySymlinks(ms); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(b) != "v" {
		t.Fatalf("through the link: %q %v", b, err)
	}
	// Again (a restart): the link is kept; a stale link is replaced.
	if err := applySymlinks(ms); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(tmp, "other")
	os.Mkdir(other, 0o755)
	if err := applySymlinks([]Mount{{Source: other, Target: target}}); err != nil {
		t.Fatal(err)
	}
	if d, _ := os.Readlink(target); d != other {
		t.Fatalf("link -> %q, want %q", d, other)
	}
	// A real directory is never replaced.
	real := filepath.Join(root, "real")
	os.MkdirAll(real, 0o755)
	err := applySymlinks([]Mount{{Source: src, Target: real}})
	if err == nil || !strings.Contains(err.Error(), "exists and is not a symlink") {
		t.Fatalf("over a directory: %v", err)
	}
	if err := applySymlinks([]Mount{{Source: filepath.Join(tmp, "missing"), Target: filepath.Join(root, "m")}}); err == nil {
		t.Fatal("missing source accepted")
	}
}
