package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileReplacesAndLeavesNoTemp(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "dir")
	p := filepath.Join(dir, "f")
	for _, content := range []string{"one", "two"} {
		if err := WriteFile(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != content {
			t.Fatalf("%q %v", got, err)
		}
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", st.Mode())
	}
	if d, _ := os.Stat(dir); d.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v", d.Mode())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temp files left: %v", entries)
	}
}

func TestWriteFileFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("old"), 0o600)
	if err := WriteFile(filepath.Join(p, "under-a-file"), []byte("x"), 0o600); err == nil {
		t.Fatal("want an error writing below a regular file")
	}
	if got, _ := os.ReadFile(p); string(got) != "old" {
		t.Fatalf("old file changed: %q", got)
	}
}

func TestWriteFileNoSyncReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	for _, v := range []string{"one", "two"} {
		if err := WriteFileNoSync(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(p); string(got) != v {
			t.Fatalf("read %q, want %q", got, v)
		}
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("temp files left: %v", entries)
	}
}
