package mounts

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// applySymlinks is the fallback where there are no mount namespaces: a
// symlink at each Target points to its Source (Target's parent directories
// are created). The caller passes Targets inside the container's own root
// directory. An existing symlink is replaced; anything else at Target is
// refused. ReadOnly cannot be enforced this way and is ignored.
func applySymlinks(ms []Mount) error {
	for _, m := range ms {
		if !filepath.IsAbs(m.Target) || !filepath.IsAbs(m.Source) {
			return fmt.Errorf("volume mount %s → %s: paths must be absolute", m.Source, m.Target)
		}
		target := filepath.Clean(m.Target)
		if _, err := os.Stat(m.Source); err != nil {
			return fmt.Errorf("volume mount %s → %s: source: %w", m.Source, m.Target, err)
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return fmt.Errorf("volume mount %s → %s: create parent: %w", m.Source, m.Target, err)
		}
		fi, err := os.Lstat(target)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return fmt.Errorf("volume mount %s → %s: %w", m.Source, m.Target, err)
		case fi.Mode()&os.ModeSymlink == 0:
			return fmt.Errorf("volume mount %s → %s: %s exists and is not a symlink", m.Source, m.Target, target)
		default:
			if dest, _ := os.Readlink(target); dest == m.Source {
				continue
			}
			if err := os.Remove(target); err != nil {
				return fmt.Errorf("volume mount %s → %s: replace symlink: %w", m.Source, m.Target, err)
			}
		}
		if err := os.Symlink(m.Source, target); err != nil {
			return fmt.Errorf("volume mount %s → %s: symlink: %w", m.Source, m.Target, err)
		}
	}
	return nil
}
