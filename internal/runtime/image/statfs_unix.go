//go:build linux || darwin

package image

import "golang.org/x/sys/unix"

// statfs returns the capacity and available bytes of path's filesystem.
func statfs(path string) (capacity, available uint64) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0
	}
	return uint64(st.Blocks) * uint64(st.Bsize), uint64(st.Bavail) * uint64(st.Bsize)
}

// mkfifo lays down a layer's fifo.
func mkfifo(path string, mode uint32) error { return unix.Mkfifo(path, mode) }
