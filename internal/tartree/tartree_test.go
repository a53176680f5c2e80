package tartree

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

type entry struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
	link     string
	body     string
}

// tree makes root/{a.txt (0640), bin/ {tool (0755)}, lib -> bin, z/ {in}}.
func tree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"bin", "z"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, f := range map[string]struct {
		body string
		mode fs.FileMode
	}{"a.txt": {"hello", 0o640}, "bin/tool": {"#!/bin/sh\n", 0o755}, "z/in": {"in", 0o644}} {
		p := filepath.Join(root, name)
		if err := os.WriteFile(p, []byte(f.body), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	if err := os.Symlink("bin", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	return root
}

func pack(t *testing.T, root, prefix string, o Options) []entry {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := Write(tw, root, prefix, o); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var got []entry
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, entry{h.Name, h.Typeflag, h.Mode & 0o7777, h.Uid, h.Gid, h.Linkname, string(b)})
	}
}

func TestWritePacksTheTreeInOrderOwnedByRoot(t *testing.T) {
	got := pack(t, tree(t), "", Options{})
	want := []entry{
		{name: "a.txt", typ: tar.TypeReg, mode: 0o640, body: "hello"},
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/tool", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\n"},
		{name: "lib", typ: tar.TypeSymlink, mode: 0o777, link: "bin"},
		{name: "z/", typ: tar.TypeDir, mode: 0o755},
		{name: "z/in", typ: tar.TypeReg, mode: 0o644, body: "in"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

func TestWriteUnderAPrefixWritesTheRootsEntry(t *testing.T) {
	got := pack(t, tree(t), "/app", Options{})
	var names []string
	for _, e := range got {
		names = append(names, e.name)
	}
	want := []string{"app/", "app/a.txt", "app/bin/", "app/bin/tool", "app/lib", "app/z/", "app/z/in"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("names %q, want %q", names, want)
	}
}

func TestWriteOneFile(t *testing.T) {
	root := tree(t)
	got := pack(t, filepath.Join(root, "a.txt"), "/etc/greeting", Options{})
	want := []entry{{name: "etc/greeting", typ: tar.TypeReg, mode: 0o640, body: "hello"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestWriteSkipAndHeader(t *testing.T) {
	root := tree(t)
	got := pack(t, root, "", Options{
		Skip: func(p string, d fs.DirEntry) error {
			switch filepath.Base(p) {
			case "bin":
				return SkipEntry // its contents still come
			case "z":
				return filepath.SkipDir
			}
			return nil
		},
		Header: func(h *tar.Header) error {
			h.Uid, h.Gid = 1000, 1001
			return nil
		},
	})
	var names []string
	for _, e := range got {
		names = append(names, e.name)
		if e.uid != 1000 || e.gid != 1001 {
			t.Errorf("%s owned by %d:%d, want 1000:1001", e.name, e.uid, e.gid)
		}
	}
	if want := []string{"a.txt", "bin/tool", "lib"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("names %q, want %q", names, want)
	}

	stop := errors.New("stop")
	var buf bytes.Buffer
	if err := Write(tar.NewWriter(&buf), root, "", Options{Header: func(*tar.Header) error { return stop }}); !errors.Is(err, stop) {
		t.Fatalf("Header's error: got %v", err)
	}
}
