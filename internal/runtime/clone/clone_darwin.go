//go:build darwin

package clone

import (
	"io/fs"

	"golang.org/x/sys/unix"
)

// treeNative clones the whole tree with one clonefile(2) call (APFS clones
// directories recursively). ok=false means fall back to walking.
func treeNative(src, dst string) (Method, bool, error) {
	if err := unix.Clonefile(src, dst, unix.CLONE_NOFOLLOW); err != nil {
		if unsupported(err) {
			return "", false, nil
		}
		return "", false, err
	}
	return Clonefile, true, nil
}

// reflinkFile clones a single file with clonefile(2).
func reflinkFile(src, dst string, mode fs.FileMode) (bool, error) {
	if err := unix.Clonefile(src, dst, unix.CLONE_NOFOLLOW); err != nil {
		return false, err
	}
	return true, nil
}
