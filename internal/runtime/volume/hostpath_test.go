//go:build unix

package volume

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestCheckHostPath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	subdir := filepath.Join(dir, "subdir")
	os.Mkdir(subdir, 0o755)
	linkToDir := filepath.Join(dir, "linktodir")
	os.Symlink(subdir, linkToDir)
	missing := filepath.Join(dir, "missing")
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	cases := []tc{
		{missing, "", ""},
		{"relative/is/fine/unchecked", "", ""},
		{subdir, "Directory", ""},
		{linkToDir, "Directory", ""}, // symlinks are followed
		{file, "Directory", "hostPath type check failed: " + file + " is not a directory"},
		{missing, "Directory", "hostPath type check failed: " + missing + " is not a directory"},
		{file, "DirectoryOrCreate", "hostPath type check failed: " + file + " is not a directory"},
		{subdir, "DirectoryOrCreate", ""},
		{file, "File", ""},
		{file, "FileOrCreate", ""},
		{subdir, "File", "hostPath type check failed: " + subdir + " is not a file"},
		{subdir, "FileOrCreate", "hostPath type check failed: " + subdir + " is not a file"},
		{missing, "File", "is not a file"},
		{"/dev/null", "File", "/dev/null is not a file"},
		{sock, "Socket", ""},
		{file, "Socket", file + " is not a socket file"},
		{"/dev/null", "CharDevice", ""},
		{file, "CharDevice", file + " is not a character device"},
		{"/dev/null", "BlockDevice", "/dev/null is not a block device"},
		{missing, "BlockDevice", "is not a block device"},
		{file, "Bogus", `invalid type "Bogus" (want "", DirectoryOrCreate, Directory, FileOrCreate, File, Socket, CharDevice or BlockDevice)`},
		{file, "directory", `invalid type "directory"`},
		{"rel", "Directory", "rel is not an absolute path"},
		{filepath.Join(missing, "deep", "file"), "FileOrCreate", "no such file or directory"}, // parent is not created
	}
	checkCases(t, cases)
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatalf("a failed check created %s", missing)
	}
}

type tc struct{ path, typ, err string }

func checkCases(t *testing.T, cases []tc) {
	t.Helper()
	for _, c := range cases {
		err := CheckHostPath(c.path, c.typ)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("CheckHostPath(%s, %q) = %v", c.path, c.typ, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("CheckHostPath(%s, %q) = %v, want error containing %q", c.path, c.typ, err, c.err)
		}
	}
}

// A block device passes BlockDevice and fails CharDevice: one of the
// host's, or one made in a temp dir (root may mknod).
func TestCheckHostPathBlockDevice(t *testing.T) {
	var block string
	for _, p := range []string{"/dev/loop0", "/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/disk0"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0 {
			block = p
			break
		}
	}
	if block == "" {
		p := filepath.Join(t.TempDir(), "block")
		if err := syscall.Mknod(p, syscall.S_IFBLK|0o600, 0); err != nil {
			t.Skipf("no block device on this host, and none can be made (%v): the BlockDevice success case needs one", err)
		}
		block = p
	}
	checkCases(t, []tc{{block, "BlockDevice", ""}, {block, "CharDevice", "is not a character device"}})
}

func TestCheckHostPathCreate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	dir := t.TempDir()

	deep := filepath.Join(dir, "a", "b", "c")
	if err := CheckHostPath(deep, "DirectoryOrCreate"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "a"), deep} {
		if fi, err := os.Stat(p); err != nil || fi.Mode() != os.ModeDir|0o755 {
			t.Fatalf("%s: %v %v", p, fi.Mode(), err)
		}
	}
	if err := CheckHostPath(deep, "DirectoryOrCreate"); err != nil {
		t.Fatalf("again: %v", err)
	}

	f := filepath.Join(deep, "f")
	if err := CheckHostPath(f, "FileOrCreate"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(f); err != nil || fi.Mode() != 0o644 || fi.Size() != 0 {
		t.Fatalf("%s: %v %v", f, fi, err)
	}
	// An existing file is left alone.
	os.WriteFile(f, []byte("keep"), 0o600)
	if err := CheckHostPath(f, "FileOrCreate"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(f); string(b) != "keep" {
		t.Fatalf("content = %q", b)
	}

	// A dangling symlink is "missing" but cannot be created over.
	dangling := filepath.Join(dir, "dangling")
	os.Symlink(filepath.Join(dir, "nowhere", "x"), dangling)
	if err := CheckHostPath(dangling, "DirectoryOrCreate"); err == nil {
		t.Fatal("DirectoryOrCreate over a dangling symlink: no error")
	}
}
