package nodeproc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The server finds k3sm-runtimed beside its own executable, and a missing
// or unusable one is an error naming the file and how to build it.
func TestRuntimedPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "k3sm")
	want := filepath.Join(dir, RuntimedBinary)
	for _, c := range []struct {
		name  string
		setup func()
	}{
		{"missing", func() {}},
		{"not executable", func() { os.WriteFile(want, []byte("x"), 0o644) }},
		{"a directory", func() { os.Remove(want); os.Mkdir(want, 0o755) }},
	} {
		c.setup()
		_, err := RuntimedPath(exe)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "make bin/k3sm-runtimed") {
			t.Errorf("%s: err %v, want one naming %s and make bin/k3sm-runtimed", c.name, err, want)
		}
	}
	os.Remove(want)
	if err := os.WriteFile(want, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := RuntimedPath(exe); err != nil || got != want {
		t.Errorf("runtimedPath = %q, %v; want %q", got, err, want)
	}
}

// A missing k3sm-netd is an error naming the file, how to build it and how
// to run without it.
func TestNetdPathMissing(t *testing.T) {
	dir := t.TempDir()
	_, err := NetdPath(filepath.Join(dir, "k3sm"))
	want := filepath.Join(dir, NetdBinary)
	for _, s := range []string{"pod network: " + want + " not found", "make bin/k3sm-netd", "--pod-network=host"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("err %v, want one saying %q", err, s)
		}
	}
}
