//go:build unix

package volume

import (
	"io/fs"
	"syscall"
)

// statBlocks reads the inode identity, 512-byte block count and link count
// of an lstat result.
func statBlocks(fi fs.FileInfo) (dev, ino uint64, blocks int64, nlink uint64, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, 0, 0, false
	}
	return uint64(st.Dev), uint64(st.Ino), int64(st.Blocks), uint64(st.Nlink), true
}
