package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A helper is found beside the executable, and only as an executable
// file; otherwise the error names its path and the make target that
// builds it.
func TestBeside(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "k3sm")
	want := filepath.Join(dir, "k3sm-helper")
	for _, c := range []struct {
		name, problem string
		setup         func() error
	}{
		{"missing", want + " not found", func() error { return nil }},
		{"not executable", want + " is not an executable file", func() error { return os.WriteFile(want, []byte("x"), 0o644) }},
		{"a directory", want + " is not an executable file", func() error {
			if err := os.Remove(want); err != nil {
				return err
			}
			return os.Mkdir(want, 0o755)
		}},
	} {
		if err := c.setup(); err != nil {
			t.Fatal(err)
		}
		got, err := Beside(exe, "k3sm-helper")
		wantErr := c.problem + ": build it (make bin/k3sm-helper, or go build -o " + want + " ./cmd/k3sm-helper)"
		if got != "" || err == nil || err.Error() != wantErr {
			t.Errorf("%s: Beside = %q, %v; want an error %q", c.name, got, err, wantErr)
		}
	}
	if err := os.Remove(want); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(want, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := Beside(exe, "k3sm-helper"); err != nil || got != want {
		t.Errorf("Beside = %q, %v; want %q", got, err, want)
	}
	// Only the directory of exe counts, not exe itself nor the working
	// directory.
	if got, err := Beside(filepath.Join(t.TempDir(), "k3sm"), "k3sm-helper"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("Beside in another directory = %q, %v; want not found", got, err)
	}
}
