//go:build linux

package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The mount points of a container's root resolve as the container sees
// its paths: an image's symlinks lead inside the root, absolute ones from
// the root, and none out of it.
func TestRootResolvesInside(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	for _, d := range []string{"etc", "run", "data"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	os.Symlink("/run", filepath.Join(dir, "var-run"))                                     // absolute, inside
	os.Symlink("../run/systemd/resolve/stub.conf", filepath.Join(dir, "etc/resolv.conf")) // dangling
	os.Symlink(outside, filepath.Join(dir, "escape"))                                     // out of the root
	os.WriteFile(filepath.Join(dir, "etc/hosts"), []byte("x"), 0o644)
	r, err := openRoot(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	where := func(fd int) string {
		t.Helper()
		p, err := os.Readlink(fdPath(fd))
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for rel, want := range map[string]string{
		"/var-run/secrets/token": filepath.Join(dir, "run/secrets/token"),
		"/data/a/b":              filepath.Join(dir, "data/a/b"),
	} {
		fd, err := r.mkdirAll(rel, 0o755)
		if err != nil {
			t.Fatalf("mkdirAll %s: %v", rel, err)
		}
		if got := where(fd); got != want {
			t.Errorf("mkdirAll %s made %s, want %s", rel, got, want)
		}
	}
	// A symlink to a host path resolves in the root, where it leads
	// nowhere: refused, and nothing is made on the host.
	if fd, err := r.mkdirAll("/escape/x", 0o755); err == nil {
		if got := where(fd); !strings.HasPrefix(got, dir+"/") {
			t.Errorf("mkdirAll /escape/x made %s, outside the root", got)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("a mount point was made outside the root: %v", ents)
	}
	for rel, want := range map[string]string{
		"/etc/hosts":       filepath.Join(dir, "etc/hosts"),
		"/etc/resolv.conf": filepath.Join(dir, "etc/resolv.conf"), // the dangling link replaced by a file
		"/etc/hostname":    filepath.Join(dir, "etc/hostname"),
	} {
		fd, err := r.file(rel)
		if err != nil {
			t.Fatalf("file %s: %v", rel, err)
		}
		if got := where(fd); got != want {
			t.Errorf("file %s is %s, want %s", rel, got, want)
		}
		if fi, err := os.Lstat(want); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("file %s: %v %v, want a regular file", rel, fi, err)
		}
	}
}
