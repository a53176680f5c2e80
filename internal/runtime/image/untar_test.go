package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestUntarSpecialFiles(t *testing.T) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	hdr := func(h *tar.Header, data string) {
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(data))
	}
	hdr(&tar.Header{Name: "run/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	hdr(&tar.Header{Name: "run/initctl", Typeflag: tar.TypeFifo, Mode: 0o600, Uid: 7, Gid: 8}, "")
	hdr(&tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}, "")
	hdr(&tar.Header{Name: "bin/su", Typeflag: tar.TypeReg, Mode: 0o4755}, "su")
	hdr(&tar.Header{Name: "escape", Typeflag: tar.TypeSymlink, Linkname: "/"}, "")
	hdr(&tar.Header{Name: "escape/etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, "x")
	tw.Close()

	root := t.TempDir()
	_, err := untar(context.Background(), tar.NewReader(&b), root)
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("an entry through a symlink was written (err %v)", err)
	}
	fi, err := os.Lstat(filepath.Join(root, "run/initctl"))
	if err != nil {
		t.Fatalf("the layer's fifo: %v", err)
	}
	if fi.Mode().Type() != fs.ModeNamedPipe || fi.Mode().Perm() != 0o600 {
		t.Fatalf("run/initctl is %v, want a fifo 0600", fi.Mode())
	}
	if _, err := os.Lstat(filepath.Join(root, "dev/null")); !os.IsNotExist(err) {
		t.Fatalf("a device node was made from a layer (%v)", err)
	}
	if owner {
		uid, gid := fileOwner(t, fi)
		if uid != 7 || gid != 8 {
			t.Fatalf("fifo owned by %d:%d, want 7:8", uid, gid)
		}
		if fi, _ := os.Stat(filepath.Join(root, "bin/su")); fi.Mode()&fs.ModeSetuid == 0 {
			t.Fatalf("bin/su lost its setuid bit: %v", fi.Mode())
		}
	}
}

func fileOwner(t *testing.T, fi fs.FileInfo) (uint32, uint32) {
	t.Helper()
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Skip("no owner in this system's FileInfo")
	}
	return st.Uid, st.Gid
}
