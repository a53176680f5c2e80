package doctor

import (
	"golang.org/x/sys/unix"
)

func osName() string { return "darwin" }

// kernelChecks: the Linux kernel features have no macOS counterpart to
// check; what the runtime uses there is clonefile on APFS.
func kernelChecks(dir, _ string) []Check {
	fstype, err := fsType(dir)
	return []Check{apfsVerdict(dir, fstype, err)}
}

func diskUsage(path string) (DiskUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return DiskUsage{}, err
	}
	bs := uint64(st.Bsize)
	return DiskUsage{Total: st.Blocks * bs, Avail: st.Bavail * bs, Inodes: st.Files, InodesFree: st.Ffree}, nil
}

func fsType(path string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "", err
	}
	return unix.ByteSliceToString(st.Fstypename[:]), nil
}

// ntpSynced: macOS exposes no kernel NTP state without cgo.
func ntpSynced() (synced, known bool) { return false, false }
