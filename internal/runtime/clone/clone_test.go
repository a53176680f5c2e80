package clone

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// makeTree builds a small image-like tree.
func makeTree(t *testing.T, root string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "app", "etc"), 0o755))
	must(os.WriteFile(filepath.Join(root, "app", "server"), bytes.Repeat([]byte("ELF"), 50000), 0o755))
	must(os.WriteFile(filepath.Join(root, "app", "etc", "conf"), []byte("a=1\n"), 0o640))
	must(os.Symlink("server", filepath.Join(root, "app", "link")))
	must(os.Symlink("/nonexistent/abs", filepath.Join(root, "dangling")))
	must(os.Mkdir(filepath.Join(root, "empty"), 0o711))
}

func checkTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		q := filepath.Join(dst, rel)
		si, _ := os.Lstat(p)
		di, err := os.Lstat(q)
		if err != nil {
			t.Errorf("%s missing in clone: %v", rel, err)
			return nil
		}
		if si.Mode() != di.Mode() {
			t.Errorf("%s mode %v, want %v", rel, di.Mode(), si.Mode())
		}
		switch {
		case si.Mode().IsRegular():
			a, _ := os.ReadFile(p)
			b, _ := os.ReadFile(q)
			if !bytes.Equal(a, b) {
				t.Errorf("%s content differs", rel)
			}
		case si.Mode()&fs.ModeSymlink != 0:
			a, _ := os.Readlink(p)
			b, _ := os.Readlink(q)
			if a != b {
				t.Errorf("%s link %q, want %q", rel, b, a)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Writing the clone must not touch the source.
	if err := os.WriteFile(filepath.Join(dst, "app", "etc", "conf"), []byte("changed"), 0o640); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "app", "etc", "conf")); string(b) != "a=1\n" {
		t.Errorf("source changed through the clone: %q", b)
	}
}

// TestCopyFallback walks a tree with Tree's plain-copy fallback, whatever
// this machine's filesystem could clone.
func TestCopyFallback(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	makeTree(t, src)
	m, err := walk(src, dst, func(s, d string, mode fs.FileMode) (Method, error) {
		return Copy, copyFile(s, d, mode)
	})
	if err != nil {
		t.Fatal(err)
	}
	if m != Copy {
		t.Errorf("method %q, want copy", m)
	}
	checkTree(t, src, dst)
}

// TestTreeOnTempDir clones on whatever filesystem holds the temp dir and
// reports the method this machine takes.
func TestTreeOnTempDir(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	makeTree(t, src)
	m, err := Tree(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("filesystem of %s: clone method %s (probe says %s)", dir, m, Probe(dir))
	if m != Probe(dir) && !(runtime.GOOS == "darwin") {
		t.Errorf("Tree used %s but Probe says %s", m, Probe(dir))
	}
	checkTree(t, src, dst)
	if _, err := Tree(src, dst); err == nil {
		t.Error("cloning onto an existing destination must fail")
	}
}

// TestIntegrationReflinkXFS makes a reflink-capable XFS filesystem on a loop
// device and checks that files really are cloned with FICLONE there.
func TestIntegrationReflinkXFS(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	if runtime.GOOS != "linux" {
		t.Skip("FICLONE is Linux only")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a loop filesystem")
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		t.Skip("mkfs.xfs not installed (apt-get install xfsprogs)")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "xfs.img")
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if out, err := exec.Command("truncate", "-s", "320M", img).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v %s", err, out)
	}
	if out, err := exec.Command("mkfs.xfs", "-q", "-m", "reflink=1", img).CombinedOutput(); err != nil {
		t.Skipf("mkfs.xfs with reflink failed: %v %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot loop-mount here: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
	src, dst := filepath.Join(mnt, "src"), filepath.Join(mnt, "dst")
	makeTree(t, src)
	m, err := Tree(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if m != Reflink {
		t.Fatalf("method %q on XFS reflink=1, want reflink", m)
	}
	if p := Probe(mnt); p != Reflink {
		t.Errorf("probe %q, want reflink", p)
	}
	checkTree(t, src, dst)
}
