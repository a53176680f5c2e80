package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// The hostPath volume types (core/v1 HostPathType).
const (
	HostPathUnset             = ""
	HostPathDirectoryOrCreate = "DirectoryOrCreate"
	HostPathDirectory         = "Directory"
	HostPathFileOrCreate      = "FileOrCreate"
	HostPathFile              = "File"
	HostPathSocket            = "Socket"
	HostPathCharDevice        = "CharDevice"
	HostPathBlockDevice       = "BlockDevice"
)

// CheckHostPath applies a hostPath volume's type check as the kubelet does
// (pkg/volume/hostpath checkType), following symlinks:
//
//   - "": no check at all (the path need not exist).
//   - DirectoryOrCreate: if nothing is there, mkdir -p with 0755 (umask
//     applies, as in the kubelet); if something is there it must be a
//     directory.
//   - Directory: must exist and be a directory.
//   - FileOrCreate: if nothing is there, create an empty file 0644 (umask
//     applies); if something is there it must be a regular file. The parent
//     directory is NOT created: the kubelet's makeFile does a bare
//     open(O_CREATE), and the Kubernetes docs say "FileOrCreate mode does not
//     create the parent directory of the file"; a missing parent is an error.
//   - File: must exist and be a regular file.
//   - Socket, CharDevice, BlockDevice: must exist and be one.
//
// Errors read like the kubelet's: "hostPath type check failed: /x is not a
// directory". Another type is an error naming the allowed values. With a
// type set, path must be absolute.
func CheckHostPath(path, typ string) error {
	switch typ {
	case HostPathUnset:
		return nil
	case HostPathDirectoryOrCreate, HostPathDirectory, HostPathFileOrCreate, HostPathFile,
		HostPathSocket, HostPathCharDevice, HostPathBlockDevice:
	default:
		return fmt.Errorf("hostPath %s: invalid type %q (want \"\", %s, %s, %s, %s, %s, %s or %s)",
			path, typ, HostPathDirectoryOrCreate, HostPathDirectory, HostPathFileOrCreate,
			HostPathFile, HostPathSocket, HostPathCharDevice, HostPathBlockDevice)
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("hostPath type check failed: %s is not an absolute path", path)
	}
	fi, err := os.Stat(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("hostPath type check failed: %w", err)
	}
	exists := err == nil
	switch typ {
	case HostPathDirectoryOrCreate:
		if !exists {
			if err := os.MkdirAll(path, 0o755); err != nil {
				return fmt.Errorf("hostPath type check failed: creating directory: %w", err)
			}
			return nil
		}
		fallthrough
	case HostPathDirectory:
		if !exists || !fi.IsDir() {
			return fmt.Errorf("hostPath type check failed: %s is not a directory", path)
		}
	case HostPathFileOrCreate:
		if !exists {
			f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
			if err != nil {
				return fmt.Errorf("hostPath type check failed: creating file: %w", err)
			}
			return f.Close()
		}
		fallthrough
	case HostPathFile:
		if !exists || !fi.Mode().IsRegular() {
			return fmt.Errorf("hostPath type check failed: %s is not a file", path)
		}
	case HostPathSocket:
		if !exists || fi.Mode()&fs.ModeSocket == 0 {
			return fmt.Errorf("hostPath type check failed: %s is not a socket file", path)
		}
	case HostPathCharDevice:
		if !exists || fi.Mode()&fs.ModeCharDevice == 0 {
			return fmt.Errorf("hostPath type check failed: %s is not a character device", path)
		}
	case HostPathBlockDevice:
		if !exists || fi.Mode()&fs.ModeDevice == 0 || fi.Mode()&fs.ModeCharDevice != 0 {
			return fmt.Errorf("hostPath type check failed: %s is not a block device", path)
		}
	}
	return nil
}
