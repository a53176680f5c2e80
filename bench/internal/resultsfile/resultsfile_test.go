package resultsfile

import (
	"os"
	"path/filepath"
	"testing"
)

const (
	begin = "<!-- bench/x: begin -->"
	end   = "<!-- bench/x: end -->"
)

func write(t *testing.T, path, body string) string {
	t.Helper()
	if err := WriteSection(path, begin, end, body); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWriteSectionStartsAMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "RESULTS.md")
	want := "# Benchmark results\n\n" + begin + "\n## X\nfirst\n" + end + "\n"
	if got := write(t, path, "## X\nfirst\n"); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestWriteSectionReplacesTheMarkedSectionOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "RESULTS.md")
	before := "# Results\n\nintro\n\n"
	other := "<!-- bench/y: begin -->\n## Y\n<!-- bench/y: end -->\n"
	after := "\n## By hand\n\nkept\n"
	old := before + begin + "\n## X\nfirst\n" + end + "\n" + other + after
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	want := before + begin + "\n## X\nsecond\n" + end + "\n" + other + after
	if got := write(t, path, "## X\nsecond\n"); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	// Once more: the markers are not duplicated.
	if got := write(t, path, "## X\nsecond\n"); got != want {
		t.Fatalf("rewritten again:\n%s\nwant:\n%s", got, want)
	}
}

func TestWriteSectionAppendsANewSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "RESULTS.md")
	old := "# Results\n\n<!-- bench/y: begin -->\n## Y\n<!-- bench/y: end -->\n\n\n"
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	want := "# Results\n\n<!-- bench/y: begin -->\n## Y\n<!-- bench/y: end -->\n\n" + begin + "\n## X\n" + end + "\n"
	if got := write(t, path, "## X\n"); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}
