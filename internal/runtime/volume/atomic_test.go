//go:build unix

package volume

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// entries lists dir's names, sorted.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func hidden(names []string) (ts []string, other []string) {
	for _, n := range names {
		if strings.HasPrefix(n, "..") && n != dataDirName {
			ts = append(ts, n)
		} else {
			other = append(other, n)
		}
	}
	return
}

// setGrace sets retiredGrace for one test.
func setGrace(t *testing.T, d time.Duration) {
	old := retiredGrace
	retiredGrace = d
	t.Cleanup(func() { retiredGrace = old })
}

func mustWrite(t *testing.T, dir string, files []File) bool {
	t.Helper()
	changed, err := WriteAtomic(dir, files)
	if err != nil {
		t.Fatalf("WriteAtomic: %v", err)
	}
	return changed
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWriteAtomicLayout(t *testing.T) {
	setGrace(t, 0)
	dir := filepath.Join(t.TempDir(), "vol") // created by WriteAtomic
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)

	changed := mustWrite(t, dir, []File{
		{Path: "a", Content: []byte("A")},
		{Path: "sub/dir/b", Content: []byte("B"), Mode: 0o600},
		{Path: "sub/c", Content: []byte("C"), Mode: 0o755},
		{Path: "empty"},
	})
	if !changed {
		t.Fatal("first write: changed = false")
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("dir: %v %v", fi.Mode(), err)
	}
	ts, visible := hidden(entries(t, dir))
	if len(ts) != 1 || !strings.HasPrefix(ts[0], "..20") {
		t.Fatalf("payload dirs = %q", ts)
	}
	if want := []string{"..data", "a", "empty", "sub"}; fmt.Sprint(visible) != fmt.Sprint(want) {
		t.Fatalf("visible = %q, want %q", visible, want)
	}
	if target, _ := os.Readlink(filepath.Join(dir, "..data")); target != ts[0] {
		t.Fatalf("..data -> %q, want %q", target, ts[0])
	}
	for _, n := range []string{"a", "sub", "empty"} {
		if target, _ := os.Readlink(filepath.Join(dir, n)); target != "..data/"+n {
			t.Fatalf("%s -> %q", n, target)
		}
	}
	for p, want := range map[string]string{"a": "A", "sub/dir/b": "B", "sub/c": "C", "empty": ""} {
		if got := readFile(t, filepath.Join(dir, p)); got != want {
			t.Fatalf("%s = %q, want %q", p, got, want)
		}
	}
	// Modes exact despite the 077 umask; intermediate dirs and the payload dir 0755.
	for p, want := range map[string]os.FileMode{
		"a": 0o644, "sub/dir/b": 0o600, "sub/c": 0o755, "empty": 0o644,
		"sub": 0o755 | os.ModeDir, "sub/dir": 0o755 | os.ModeDir, ts[0]: 0o755 | os.ModeDir,
	} {
		fi, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Fatalf("%s mode = %v, want %v", p, fi.Mode(), want)
		}
	}
}

func TestWriteAtomicUnchangedAndUpdate(t *testing.T) {
	setGrace(t, 0)
	dir := t.TempDir()
	v1 := []File{{Path: "a", Content: []byte("1")}, {Path: "d/b", Content: []byte("2"), Mode: 0o644}}
	mustWrite(t, dir, v1)
	ts1, _ := hidden(entries(t, dir))

	// Same payload, in another order, Mode 0 vs explicit 0644: unchanged.
	same := []File{{Path: "d/b", Content: []byte("2")}, {Path: "a", Content: []byte("1"), Mode: 0o644}}
	if mustWrite(t, dir, same) {
		t.Fatal("same payload: changed = true")
	}
	if ts, _ := hidden(entries(t, dir)); fmt.Sprint(ts) != fmt.Sprint(ts1) {
		t.Fatalf("same payload rewrote: %q -> %q", ts1, ts)
	}

	steps := []struct {
		name  string
		files []File
	}{
		{"content", []File{{Path: "a", Content: []byte("1x")}, {Path: "d/b", Content: []byte("2")}}},
		{"mode", []File{{Path: "a", Content: []byte("1x"), Mode: 0o600}, {Path: "d/b", Content: []byte("2")}}},
		{"added", []File{{Path: "a", Content: []byte("1x"), Mode: 0o600}, {Path: "d/b", Content: []byte("2")}, {Path: "d/c"}}},
		{"removed nested", []File{{Path: "a", Content: []byte("1x"), Mode: 0o600}, {Path: "d/c"}}},
		{"new top", []File{{Path: "a", Content: []byte("1x"), Mode: 0o600}, {Path: "d/c"}, {Path: "e"}}},
		{"removed top", []File{{Path: "e", Content: []byte("E")}}},
	}
	for _, s := range steps {
		before, _ := hidden(entries(t, dir))
		if !mustWrite(t, dir, s.files) {
			t.Fatalf("%s: changed = false", s.name)
		}
		// With no grace the replaced payload directory goes at once.
		after, _ := hidden(entries(t, dir))
		cur, _ := os.Readlink(filepath.Join(dir, "..data"))
		if len(before) != 1 || len(after) != 1 || after[0] != cur || cur == before[0] {
			t.Fatalf("%s: payload dirs %q -> %q (..data -> %s)", s.name, before, after, cur)
		}
		if mustWrite(t, dir, s.files) {
			t.Fatalf("%s: second write changed = true", s.name)
		}
		ts, visible := hidden(entries(t, dir))
		if len(ts) != 1 {
			t.Fatalf("%s: payload dirs = %q", s.name, ts)
		}
		wantVisible := map[string]bool{"..data": true}
		for _, f := range s.files {
			wantVisible[strings.SplitN(f.Path, "/", 2)[0]] = true
			got, err := os.ReadFile(filepath.Join(dir, f.Path))
			if err != nil || !bytes.Equal(got, f.Content) {
				t.Fatalf("%s: %s = %q, %v", s.name, f.Path, got, err)
			}
		}
		if len(visible) != len(wantVisible) {
			t.Fatalf("%s: visible = %q", s.name, visible)
		}
		for _, v := range visible {
			if !wantVisible[v] {
				t.Fatalf("%s: stale %q in %q", s.name, v, visible)
			}
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "d")); !os.IsNotExist(err) {
		t.Fatalf("stale symlink d: %v", err)
	}
}

func TestWriteAtomicEmptyPayload(t *testing.T) {
	setGrace(t, 0)
	dir := t.TempDir()
	mustWrite(t, dir, []File{{Path: "a", Content: []byte("x")}})
	if !mustWrite(t, dir, nil) {
		t.Fatal("emptying: changed = false")
	}
	if mustWrite(t, dir, nil) {
		t.Fatal("empty again: changed = true")
	}
	ts, visible := hidden(entries(t, dir))
	if len(ts) != 1 || fmt.Sprint(visible) != "[..data]" {
		t.Fatalf("entries: %q %q", ts, visible)
	}
}

func TestWriteAtomicLeavesForeignEntries(t *testing.T) {
	setGrace(t, 0)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "foreign"), []byte("f"), 0o644)
	os.Symlink("/etc/hostname", filepath.Join(dir, "foreignlink"))
	mustWrite(t, dir, []File{{Path: "a"}})
	mustWrite(t, dir, []File{{Path: "b"}})
	_, visible := hidden(entries(t, dir))
	if fmt.Sprint(visible) != "[..data b foreign foreignlink]" {
		t.Fatalf("visible = %q", visible)
	}
	// A payload key colliding with a non-symlink is refused before anything is written.
	_, err := WriteAtomic(dir, []File{{Path: "foreign"}})
	if err == nil || !strings.Contains(err.Error(), "foreign") {
		t.Fatalf("collision: err = %v", err)
	}
	if readFile(t, filepath.Join(dir, "b")) != "" {
		t.Fatal("b changed")
	}
}

func TestWriteAtomicRecoversFromCrash(t *testing.T) {
	setGrace(t, 0)
	dir := t.TempDir()
	files := []File{{Path: "a", Content: []byte("A")}, {Path: "x/y", Content: []byte("Y")}}
	mustWrite(t, dir, files)
	ts, _ := hidden(entries(t, dir))

	// Crash leftovers: ..data_tmp, an orphan payload dir, a missing
	// user-visible symlink (crash right after the switch).
	if err := os.Symlink("..2000_01_01_00_00_00.1", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(dir, "..2000_01_01_00_00_00.1")
	os.MkdirAll(filepath.Join(orphan, "deep"), 0o755)
	os.WriteFile(filepath.Join(orphan, "deep", "f"), []byte("old"), 0o444)
	os.Remove(filepath.Join(dir, "x"))

	if mustWrite(t, dir, files) {
		t.Fatal("same payload after crash: changed = true")
	}
	got, visible := hidden(entries(t, dir))
	if fmt.Sprint(got) != fmt.Sprint(ts) || fmt.Sprint(visible) != "[..data a x]" {
		t.Fatalf("after repair: %q %q", got, visible)
	}
	if readFile(t, filepath.Join(dir, "x/y")) != "Y" {
		t.Fatal("x/y not readable")
	}

	// Crash before the first switch: only an orphan and ..data_tmp exist, or
	// ..data dangles.
	dir2 := t.TempDir()
	os.Mkdir(filepath.Join(dir2, "..2000_01_01_00_00_00.2"), 0o755)
	os.Symlink("..2000_01_01_00_00_00.2", filepath.Join(dir2, "..data_tmp"))
	os.Symlink("..gone", filepath.Join(dir2, "..data"))
	if !mustWrite(t, dir2, files) {
		t.Fatal("dir2: changed = false")
	}
	ts2, visible2 := hidden(entries(t, dir2))
	if len(ts2) != 1 || fmt.Sprint(visible2) != "[..data a x]" || readFile(t, filepath.Join(dir2, "a")) != "A" {
		t.Fatalf("dir2: %q %q", ts2, visible2)
	}
}

func TestWriteAtomicValidation(t *testing.T) {
	for _, tc := range []struct {
		files []File
		name  string // the path the error must name
	}{
		{[]File{{Path: ""}}, "empty"},
		{[]File{{Path: "/abs"}}, "/abs"},
		{[]File{{Path: "a/../b"}}, "a/../b"},
		{[]File{{Path: "a/.."}}, "a/.."},
		{[]File{{Path: ".."}}, `".."`},
		{[]File{{Path: "..data"}}, "..data"},
		{[]File{{Path: "..foo/x"}}, "..foo/x"},
		{[]File{{Path: "./a"}}, "./a"},
		{[]File{{Path: "a//b"}}, "a//b"},
		{[]File{{Path: "a/"}}, "a/"},
		{[]File{{Path: "."}}, `"."`},
		{[]File{{Path: "a"}, {Path: "a"}}, `duplicate path "a"`},
		{[]File{{Path: "a"}, {Path: "a/b"}}, `"a"`},
		{[]File{{Path: "x/a/b/c"}, {Path: "x/a"}}, `"x/a"`},
		{[]File{{Path: "m", Mode: os.ModeDir | 0o755}}, `"m"`},
	} {
		dir := t.TempDir()
		_, err := WriteAtomic(dir, tc.files)
		if err == nil {
			t.Errorf("%v: no error", tc.files)
			continue
		}
		if !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%v: error %q does not name %s", tc.files, err, tc.name)
		}
		if n := entries(t, dir); len(n) != 0 {
			t.Errorf("%v: wrote %q", tc.files, n)
		}
	}
	// Allowed: dots inside names, a file next to a dir with a common prefix.
	if _, err := WriteAtomic(t.TempDir(), []File{{Path: "a..b"}, {Path: ".hidden"}, {Path: "ab/c"}, {Path: "a"}}); err != nil {
		t.Fatal(err)
	}
}

func TestWriteAtomicRetiredGrace(t *testing.T) {
	setGrace(t, time.Hour)
	dir := t.TempDir()
	mustWrite(t, dir, []File{{Path: "a", Content: []byte("1")}})
	ts1, _ := os.Readlink(filepath.Join(dir, "..data"))
	// An old payload directory: its grace starts when it is replaced, not
	// when it was written.
	long := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(dir, ts1), long, long)
	// A crash leftover older than the grace goes.
	orphan := filepath.Join(dir, "..2000_01_01_00_00_00.9")
	os.Mkdir(orphan, 0o755)
	os.Chtimes(orphan, long, long)

	mustWrite(t, dir, []File{{Path: "a", Content: []byte("2")}})
	ts2, _ := os.Readlink(filepath.Join(dir, "..data"))
	mustWrite(t, dir, []File{{Path: "a", Content: []byte("3")}})
	ts3, _ := os.Readlink(filepath.Join(dir, "..data"))
	want := []string{ts1, ts2, ts3}
	sort.Strings(want)
	if ts, _ := hidden(entries(t, dir)); fmt.Sprint(ts) != fmt.Sprint(want) {
		t.Fatalf("payload dirs = %q, want %q", ts, want)
	}
	if readFile(t, filepath.Join(dir, "a")) != "3" {
		t.Fatal("a is not the newest")
	}
	// Once the grace is over, any call (even one that changes nothing)
	// removes them.
	setGrace(t, 0)
	if mustWrite(t, dir, []File{{Path: "a", Content: []byte("3")}}) {
		t.Fatal("changed = true")
	}
	if ts, _ := hidden(entries(t, dir)); fmt.Sprint(ts) != fmt.Sprint([]string{ts3}) {
		t.Fatalf("payload dirs = %q, want %q", ts, []string{ts3})
	}
}

// TestWriteAtomicConcurrentReaders reads through the user-visible paths
// while the payload flips between two versions: every read must return one
// whole version.
func TestWriteAtomicConcurrentReaders(t *testing.T) {
	dir := t.TempDir()
	big := func(c byte) []byte { return bytes.Repeat([]byte{c}, 64<<10) }
	versions := [][]File{
		{{Path: "key", Content: []byte("old-value")}, {Path: "nested/deep/key", Content: big('o')}},
		{{Path: "key", Content: []byte("new-value-longer")}, {Path: "nested/deep/key", Content: big('n')}},
	}
	valid := map[string]map[string]bool{
		"key":             {"old-value": true, "new-value-longer": true},
		"nested/deep/key": {string(big('o')): true, string(big('n')): true},
	}
	mustWrite(t, dir, versions[0])

	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for i := range 4 {
		p := []string{"key", "nested/deep/key"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				b, err := os.ReadFile(filepath.Join(dir, p))
				if err != nil {
					errc <- fmt.Errorf("read %s: %v", p, err)
					return
				}
				if !valid[p][string(b)] {
					errc <- fmt.Errorf("read %s: torn content (%d bytes)", p, len(b))
					return
				}
				reads.Add(1)
			}
		}()
	}
	for i := range 200 {
		if !mustWrite(t, dir, versions[(i+1)%2]) {
			t.Fatal("flip: changed = false")
		}
		select {
		case err := <-errc:
			stop.Store(true)
			wg.Wait()
			t.Fatal(err)
		default:
		}
	}
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	if reads.Load() == 0 {
		t.Fatal("readers never ran")
	}
	t.Logf("%d reads during 200 updates", reads.Load())
}
