package volume

import (
	"errors"
	"io/fs"
	"path/filepath"
)

// Usage returns the bytes a directory tree takes on disk as du(1) counts
// them: st_blocks*512 for every entry including dir itself, each inode once
// (hard links count once, directories and symlinks count their own blocks),
// symlinks not followed. It is what an emptyDir's sizeLimit is enforced
// against. Entries that vanish during the walk (the pod is writing) are
// skipped; an error reading dir itself is returned. Only on Unix (syscall
// Stat_t); elsewhere it returns an error.
func Usage(dir string) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p != dir && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		fi, err := d.Info() // lstat: symlinks are not followed
		if err != nil {
			if p != dir && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		dev, ino, blocks, nlink, ok := statBlocks(fi)
		if !ok {
			return errors.New("volume usage: no block counts on this platform")
		}
		if nlink > 1 && !fi.IsDir() {
			k := inode{dev, ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += blocks * 512
		return nil
	})
	if err != nil {
		return 0, err
	}
	return total, nil
}
