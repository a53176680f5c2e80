//go:build !linux

package volume

// MountTmpfs: darwin's native pods keep a memory-medium emptyDir on disk
// (ErrNoTmpfs; the runtime reports it as an Event).
func MountTmpfs(dir string, sizeBytes int64) error { return ErrNoTmpfs }

// UnmountTmpfs has nothing to undo where MountTmpfs mounts nothing.
func UnmountTmpfs(dir string) error { return nil }
