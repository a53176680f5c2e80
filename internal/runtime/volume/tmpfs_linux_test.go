package volume

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMountTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		if err := MountTmpfs(t.TempDir(), 0); err == nil {
			t.Fatal("mounted a tmpfs without root")
		}
		t.Skip("mounting a tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "v")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := MountTmpfs(dir, 1<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Fatalf("not a tmpfs: %v %x", err, st.Type)
	}
	if got := int64(st.Blocks) * st.Bsize; got != 1<<20 {
		t.Errorf("size %d, want the sizeLimit 1 MiB", got)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o777 {
		t.Errorf("mode %v, want 0777 as the kubelet's", fi.Mode().Perm())
	}
	// Again (a restarted daemon): kept, not stacked.
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MountTmpfs(dir, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "f")); err != nil {
		t.Fatalf("a second mount hid the volume's files: %v", err)
	}
	if err := UnmountTmpfs(dir); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(dir, &st); err != nil || st.Type == unix.TMPFS_MAGIC {
		t.Fatalf("still a tmpfs after UnmountTmpfs: %v", err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatalf("the directory cannot be removed after UnmountTmpfs: %v", err)
	}
	if err := UnmountTmpfs(t.TempDir()); err != nil {
		t.Fatalf("a plain directory: %v", err)
	}
}
