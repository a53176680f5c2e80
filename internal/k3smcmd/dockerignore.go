package k3smcmd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// contextIgnore is the build context's .dockerignore: what COPY and ADD
// never see, with Docker's pattern syntax and `!` exceptions.
type contextIgnore struct {
	file string // the ignore file read, for messages; "" when there is none
	pm   *patternmatcher.PatternMatcher
	n    int // patterns
}

// loadIgnore reads, as BuildKit does, <Dockerfile>.dockerignore next to the
// Dockerfile if it exists, else .dockerignore at the context's root. The
// Dockerfile and the ignore file themselves are read by the build whether
// ignored or not; ignoring them only keeps them out of COPY . (as Docker).
func loadIgnore(ctxDir, dockerfile string) (*contextIgnore, error) {
	for _, p := range []string{dockerfile + ".dockerignore", filepath.Join(ctxDir, ".dockerignore")} {
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		patterns, err := ignorefile.ReadAll(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		pm, err := patternmatcher.New(patterns)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (patterns are Go filepath.Match globs with **; fix or remove the line)", p, err)
		}
		return &contextIgnore{file: p, pm: pm, n: len(patterns)}, nil
	}
	return &contextIgnore{}, nil
}

// excluded says whether rel (relative to the context root, OS separators)
// is left out of the context: it or a parent matches, and no later `!`
// pattern brings it back.
func (ig *contextIgnore) excluded(rel string) (bool, error) {
	if ig == nil || ig.pm == nil || rel == "." || rel == "" {
		return false, nil
	}
	return ig.pm.MatchesOrParentMatches(rel)
}

// descend says whether an excluded directory must still be walked: an
// exception (`!pattern`) may bring back something inside it.
func (ig *contextIgnore) descend() bool { return ig != nil && ig.pm != nil && ig.pm.Exclusions() }
