//go:build unix

package volume

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestSubPath(t *testing.T) {
	base := t.TempDir()
	vol := filepath.Join(base, "vol")
	os.MkdirAll(filepath.Join(vol, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(vol, "a", "file"), []byte("f"), 0o644)
	os.Symlink("a/b", filepath.Join(vol, "inlink"))                    // relative, inside
	os.Symlink(filepath.Join(vol, "a"), filepath.Join(vol, "abslink")) // absolute, inside
	secret := filepath.Join(base, "secret")
	os.MkdirAll(secret, 0o700)
	os.Symlink(secret, filepath.Join(vol, "escape"))                        // absolute, outside
	os.Symlink("../../../secret", filepath.Join(vol, "a", "b", "up"))       // relative, outside
	os.Symlink("/", filepath.Join(vol, "root"))                             // the host's root
	os.Symlink("../../../vol/a", filepath.Join(vol, "a", "b", "roundtrip")) // out and back in
	os.Symlink("nowhere", filepath.Join(vol, "dangling"))
	// The volume directory itself reached through a symlink.
	volLink := filepath.Join(base, "vollink")
	os.Symlink(vol, volLink)

	ok := []struct{ vol, sub, want string }{
		{vol, "a", "a"},
		{vol, "a/b", "a/b"},
		{vol, "a/file", "a/file"},
		{vol, "./a//b/", "a/b"},
		{vol, "", ""},
		{vol, ".", ""},
		{vol, "inlink", "a/b"},
		{vol, "abslink/file", "a/file"},
		{vol, "a/b/roundtrip/file", "a/file"},
		{volLink, "inlink", "a/b"},
		{vol, "..data-like", ""}, // created below with create=true; a ".." prefix is not a ".." component
	}
	for _, c := range ok {
		create := c.sub == "..data-like"
		got, err := SubPath(c.vol, c.sub, create)
		if err != nil {
			t.Errorf("SubPath(%s, %q): %v", c.vol, c.sub, err)
			continue
		}
		want := filepath.Join(vol, c.want)
		if create {
			want = filepath.Join(vol, c.sub)
		}
		if got != want {
			t.Errorf("SubPath(%s, %q) = %s, want %s", c.vol, c.sub, got, want)
		}
	}

	bad := []struct{ sub, err string }{
		{"/etc", `subPath "/etc" must be a relative path`},
		{"..", `subPath ".." must not contain ".." components`},
		{"a/../..", `subPath "a/../.." must not contain ".." components`},
		{"a/b/..", `".." components`},
		{"escape", `subPath "escape" resolves to ` + secret + `, outside the volume ` + vol},
		{"escape/x", "outside the volume"},
		{"a/b/up", "outside the volume"},
		{"root/etc", "outside the volume"},
		{"dangling", `subPath "dangling": symlink`},
		{"a/file/x", "is not a directory"},
		{"missing", "does not exist"},
	}
	for _, c := range bad {
		_, err := SubPath(vol, c.sub, false)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("SubPath(%q) = %v, want error containing %q", c.sub, err, c.err)
		}
	}
	// create=true does not create through an escaping symlink.
	if _, err := SubPath(vol, "escape/new", true); err == nil || !strings.Contains(err.Error(), "outside the volume") {
		t.Fatalf("create through escape: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(secret, "new")); !os.IsNotExist(err) {
		t.Fatal("created outside the volume")
	}
	if _, err := SubPath(filepath.Join(base, "novol"), "a", true); err == nil {
		t.Fatal("missing volume dir: no error")
	}
}

func TestSubPathCreate(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	vol := t.TempDir()
	os.Mkdir(filepath.Join(vol, "a"), 0o755)
	os.Symlink("a", filepath.Join(vol, "link"))

	got, err := SubPath(vol, "link/x/y", true)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(vol, "a", "x", "y"); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	for _, p := range []string{"a/x", "a/x/y"} {
		fi, err := os.Stat(filepath.Join(vol, p))
		if err != nil || fi.Mode() != os.ModeDir|0o755 {
			t.Fatalf("%s: %v %v", p, fi, err)
		}
	}
	// Existing: returned as is.
	if again, err := SubPath(vol, "link/x/y", true); err != nil || again != got {
		t.Fatalf("again: %s %v", again, err)
	}
}

// A configMap key resolves to the file in the current payload directory.
func TestSubPathAtomicVolume(t *testing.T) {
	vol := t.TempDir()
	mustWrite(t, vol, []File{{Path: "key", Content: []byte("v")}, {Path: "d/k2", Content: []byte("w")}})
	ts, _ := os.Readlink(filepath.Join(vol, "..data"))
	for sub, want := range map[string]string{"key": "key", "d/k2": "d/k2", "..data/key": "key"} {
		got, err := SubPath(vol, sub, false)
		if err != nil {
			t.Fatal(err)
		}
		if w := filepath.Join(vol, ts, want); got != w {
			t.Fatalf("SubPath(%q) = %s, want %s", sub, got, w)
		}
	}
}

// A directory SubPath makes is owned as the one it is made in: in a volume
// given to a pod's user namespace, the pod's root can write in it.
func TestSubPathMakesDirsOwnedAsTheVolume(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another user needs root")
	}
	vol := t.TempDir()
	if err := os.Chown(vol, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	got, err := SubPath(vol, "a/b", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(vol, "a"), got} {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 1234 || st.Gid != 5678 {
			t.Errorf("%s owned by %d:%d, want the volume's 1234:5678", p, st.Uid, st.Gid)
		}
	}
}
