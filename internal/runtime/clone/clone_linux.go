//go:build linux

package clone

import (
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// treeNative: Linux has no whole-tree clone; files are reflinked one by one.
func treeNative(src, dst string) (Method, bool, error) { return "", false, nil }

// reflinkFile shares src's extents with a new file dst (FICLONE). It returns
// ok=false with the ioctl's error when the filesystem cannot (ext4, tmpfs,
// or src and dst on different filesystems); dst is then removed.
func reflinkFile(src, dst string, mode fs.FileMode) (bool, error) {
	syscall.ForkLock.RLock() // see copyFile
	defer syscall.ForkLock.RUnlock()
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
	if err != nil {
		return false, err
	}
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		out.Close()
		os.Remove(dst)
		return false, err
	}
	if err := out.Chmod(mode.Perm()); err != nil {
		out.Close()
		return false, err
	}
	return true, out.Close()
}
