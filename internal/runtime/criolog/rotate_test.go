package criolog

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readAll reads every record of the log at path, rotated files first.
func readAll(t *testing.T, path string, tail int64) []string {
	t.Helper()
	files, err := OpenFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	cur, off := 0, int64(0)
	if tail >= 0 {
		if cur, off, err = TailStart(files, tail); err != nil {
			t.Fatal(err)
		}
	}
	files[cur].Seek(off, io.SeekStart)
	r := NewReader(files[cur])
	var out []string
	for {
		rec, err := r.Next()
		if err == io.EOF && cur < len(files)-1 {
			cur++
			r.Reset(files[cur])
			continue
		}
		if err != nil {
			return out
		}
		out = append(out, string(rec.Content))
	}
}

func TestWriterRotatesAndKeepsMaxFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w.SetRotation(1024, 3)
	const lines = 500
	for i := range lines {
		if err := w.WriteRecord(Stdout, false, fmt.Appendf(nil, "line %04d %s", i, strings.Repeat("x", 40))); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	rot := Rotated(path)
	if len(rot) != 2 {
		t.Fatalf("want 2 rotated files beside the live one (maxFiles 3), got %d: %v", len(rot), rot)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 3 {
		t.Errorf("want 3 files in the log dir, got %d", len(ents))
	}
	for _, p := range append(rot, path) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		// A file is rotated at the first record that reaches the size.
		if fi.Size() > 1024+100 {
			t.Errorf("%s is %d bytes, over the 1 KiB max size", p, fi.Size())
		}
	}
	got := readAll(t, path, -1)
	if len(got) == 0 || len(got) >= lines {
		t.Fatalf("read %d lines across the kept files", len(got))
	}
	// What is kept is the newest lines, in order, ending with the last.
	first := lines - len(got)
	for i, l := range got {
		if want := fmt.Sprintf("line %04d ", first+i); !strings.HasPrefix(l, want) {
			t.Fatalf("line %d: %q, want prefix %q", i, l, want)
		}
	}
}

func TestTailStartAcrossFilesAndPartials(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w.SetRotation(4096, 100)
	const lines = 1000
	for i := range lines {
		content := fmt.Sprintf("line %d", i)
		if i%7 == 0 {
			// A line split into P records, as a long line is.
			w.WriteRecord(Stdout, true, []byte(content+" part1 "))
			w.WriteRecord(Stdout, true, []byte("part2 "))
		}
		w.WriteRecord(Stdout, false, []byte(content))
	}
	// An unterminated record at the end is not a line yet.
	w.f.Write([]byte("2026-01-01T00:00:00Z stdout F incompl"))
	w.Close()
	if n := len(Rotated(path)); n < 3 {
		t.Fatalf("want several rotated files, got %d", n)
	}
	for _, tail := range []int64{0, 1, 5, 150, 400, 10000} {
		got := readAll(t, path, tail)
		want := min(tail, lines)
		if int64(len(got)) != want {
			t.Fatalf("tail %d: got %d lines", tail, len(got))
		}
		for i, l := range got {
			n := lines - int(want) + i
			exp := fmt.Sprintf("line %d", n)
			if n%7 == 0 {
				exp = fmt.Sprintf("line %d part1 part2 line %d", n, n)
			}
			if l != exp {
				t.Fatalf("tail %d line %d: %q, want %q", tail, i, l, exp)
			}
		}
	}
}
