package volume

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// MountTmpfs makes dir an emptyDir of medium Memory: a tmpfs, world
// writable as the kubelet's, of at most sizeBytes (0: the kernel's default,
// half the memory; the pod's memory cgroup is charged its pages either
// way). A dir that is a tmpfs already (a daemon restarted) is kept. It needs
// CAP_SYS_ADMIN in the daemon's mount namespace: ErrNoTmpfs otherwise.
func MountTmpfs(dir string, sizeBytes int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		return nil
	}
	opts := "mode=0777"
	if sizeBytes > 0 {
		opts += ",size=" + strconv.FormatInt(sizeBytes, 10)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("%w: %v", ErrNoTmpfs, err)
		}
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	return nil
}

// UnmountTmpfs undoes MountTmpfs before the pod's directory is removed; a
// dir that is not a tmpfs is left alone.
func UnmountTmpfs(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return nil
	}
	// Detached: a shim or an exec still inside keeps it alive until it exits.
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount tmpfs %s: %w", dir, err)
	}
	return nil
}
