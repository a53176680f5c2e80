package criolog

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestCopyWritesCRIRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", MaxLine+10)
	in := "hello\nworld\n" + long + "\nno-newline"
	if err := w.Copy(Stdout, strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteRecord(Stderr, false, []byte("oops")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	raw, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("want 6 records, got %d: %q", len(lines), raw)
	}
	re := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z (stdout|stderr) [FP] `)
	for _, l := range lines {
		if !re.MatchString(l) {
			t.Errorf("record %.60q is not CRI format", l)
		}
	}
	if !strings.HasSuffix(lines[0], " stdout F hello") || !strings.Contains(lines[2], " stdout P ") ||
		!strings.HasSuffix(lines[3], " stdout F xxxxxxxxxx") || !strings.HasSuffix(lines[4], " stdout F no-newline") ||
		!strings.HasSuffix(lines[5], " stderr F oops") {
		t.Errorf("unexpected records:\n%.200s", raw)
	}

	r := NewReader(bytes.NewReader(raw))
	var got []string
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(rec.Time) > time.Minute {
			t.Errorf("bad time %v", rec.Time)
		}
		got = append(got, rec.Stream+":"+string(rec.Content))
	}
	want := []string{"stdout:hello", "stdout:world", "stdout:" + long, "stdout:no-newline", "stderr:oops"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("read back %d records, want %d (long line joined)", len(got), len(want))
	}
}

func TestReaderFollowsGrowingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	f, _ := os.Create(path)
	rf, _ := os.Open(path)
	r := NewReader(rf)
	f.WriteString("2024-01-02T03:04:05.000000006Z stdout F one\n2024-01-02T03:04:05Z std")
	rec, err := r.Next()
	if err != nil || string(rec.Content) != "one" {
		t.Fatalf("first: %q %v", rec.Content, err)
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF on a torn record, got %v", err)
	}
	f.WriteString("err F two\ngarbage line\n2024-01-02T03:04:06Z stdout F \n")
	rec, err = r.Next()
	if err != nil || string(rec.Content) != "two" || rec.Stream != Stderr {
		t.Fatalf("second: %+v %v", rec, err)
	}
	rec, err = r.Next()
	if err != nil || len(rec.Content) != 0 {
		t.Fatalf("empty line: %+v %v", rec, err)
	}
}
