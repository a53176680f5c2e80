// Package resultsfile writes a benchmark's generated section of a results file
// (bench/RESULTS.md): the text between the benchmark's own begin and end
// markers is replaced, everything outside them is kept, and a file without
// the markers gets the section appended.
package resultsfile

import (
	"errors"
	"os"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

// WriteSection replaces the section of path between beginMark and endMark
// with body (or appends it, or starts a "# Benchmark results" file when path
// is missing or blank), reading the file right before writing it
// atomically. body should end in a newline; the markers take a line each.
func WriteSection(path, beginMark, endMark, body string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	s := string(old)
	section := beginMark + "\n" + body + endMark + "\n"
	var out string
	i, j := strings.Index(s, beginMark), strings.Index(s, endMark)
	switch {
	case i >= 0 && j > i:
		out = s[:i] + section + strings.TrimPrefix(s[j+len(endMark):], "\n")
	case strings.TrimSpace(s) == "":
		out = "# Benchmark results\n\n" + section
	default:
		out = strings.TrimRight(s, "\n") + "\n\n" + section
	}
	return atomicfile.WriteFileNoSync(path, []byte(out), 0o644)
}
