package architecture

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// packageDirs lists, from the module root, every directory under roots
// that holds a Go file, as the go command sees packages: testdata and
// names starting with "." or "_" are skipped.
func packageDirs(t *testing.T, roots ...string) []string {
	t.Helper()
	var dirs []string
	for _, root := range roots {
		err := filepath.WalkDir(filepath.Join("../..", root), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if n := d.Name(); n == "testdata" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") {
					return filepath.SkipDir
				}
				return nil
			}
			if strings.HasSuffix(d.Name(), ".go") {
				rel, err := filepath.Rel("../..", filepath.Dir(p))
				if err != nil {
					return err
				}
				if rel = filepath.ToSlash(rel); !slices.Contains(dirs, rel) {
					dirs = append(dirs, rel)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return dirs
}

var backticked = regexp.MustCompile("`([^`]+)`")

// tablePackages returns the package paths named in the packages column of
// docs/architecture.md's table. A name without a directory is beside the
// one before it in the same cell (`internal/server/snapshot`, `kinedb`).
func tablePackages(t *testing.T, doc string) []string {
	t.Helper()
	var names []string
	in := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "| part | packages |") {
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.HasPrefix(cells[2], "---") {
			continue
		}
		dir := ""
		for _, m := range backticked.FindAllStringSubmatch(cells[2], -1) {
			name := m[1]
			if strings.Contains(name, "/") {
				dir = path.Dir(name)
			} else if dir != "" {
				name = path.Join(dir, name)
			}
			names = append(names, name)
		}
	}
	if !in {
		t.Fatal("docs/architecture.md has no table headed | part | packages | runs in | owns |")
	}
	return names
}

// Every package of the tree has its line in docs/architecture.md's table,
// and every name there is a package: the table is where a reader finds
// what a package is for and which process runs it.
func TestPackageTable(t *testing.T) {
	b, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	named := tablePackages(t, string(b))
	dirs := packageDirs(t, "internal", "cmd", "api")
	for _, d := range dirs {
		if !slices.Contains(named, d) && (strings.HasPrefix(d, "internal/") || strings.HasPrefix(d, "cmd/")) {
			t.Errorf("%s is missing from docs/architecture.md's package table: add it to its part's rows with what runs it and what it owns (its package doc comment says)", d)
		}
	}
	for _, n := range named {
		if !slices.Contains(dirs, n) {
			t.Errorf("docs/architecture.md's package table names %s, which is no package directory: name each package by its path (a wildcard such as internal/x/... does not count), or drop the row of a package that is gone", n)
		}
	}
}
