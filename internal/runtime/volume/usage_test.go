//go:build unix

package volume

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func usage(t *testing.T, dir string) int64 {
	t.Helper()
	n, err := Usage(dir)
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	return n
}

func TestUsage(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	empty := usage(t, dir)
	if empty <= 0 {
		t.Fatalf("empty tree: %d, want the directories' own blocks", empty)
	}

	const mb = 1 << 20
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte{1}, mb), 0o644); err != nil {
		t.Fatal(err)
	}
	withBig := usage(t, dir)
	if withBig-empty < mb || withBig-empty > mb+64<<10 {
		t.Fatalf("1 MiB file: usage %d -> %d", empty, withBig)
	}

	// A hard link in an existing directory adds no blocks: the inode counts once.
	if err := os.Link(big, filepath.Join(sub, "link")); err != nil {
		t.Fatal(err)
	}
	if got := usage(t, dir); got != withBig {
		t.Fatalf("hard link: usage %d, want %d", got, withBig)
	}
	// ... even when only the links are inside the measured tree.
	if got := usage(t, sub); got >= withBig || got < mb {
		t.Fatalf("sub with the link: %d", got)
	}

	// A symlink to a big file outside is not followed.
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, bytes.Repeat([]byte{2}, 2*mb), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(sub, "sym")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(dir, "dirsym")); err != nil {
		t.Fatal(err)
	}
	if got := usage(t, dir); got-withBig > 64<<10 {
		t.Fatalf("symlinks followed: usage %d -> %d", withBig, got)
	}

	// Blocks, not sizes: a sparse file takes (almost) nothing.
	f, err := os.Create(filepath.Join(sub, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(100 * mb)
	f.Close()
	if got := usage(t, dir); got-withBig > 64<<10 {
		t.Fatalf("sparse file counted by size: usage %d -> %d", withBig, got)
	}
	compareWithDu(t, dir)
}

// compareWithDu checks Usage of dir against GNU du(1), in a subtest that
// is skipped, and says so, where there is no GNU du (-B1 is GNU's).
func compareWithDu(t *testing.T, dir string) {
	t.Run("du", func(t *testing.T) {
		out, err := exec.Command("du", "-s", "-B1", dir).Output()
		if err != nil {
			t.Skipf("no GNU du to compare with: %v", err)
		}
		du, err := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if got := usage(t, dir); got != du {
			t.Fatalf("Usage = %d, du -s -B1 = %d", got, du)
		}
	})
}

func TestUsageErrors(t *testing.T) {
	if _, err := Usage(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("missing dir: no error")
	}
	// A file is a tree of one entry.
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, bytes.Repeat([]byte{1}, 8192), 0o644)
	if got := usage(t, p); got < 8192 {
		t.Fatalf("file: %d", got)
	}
}
