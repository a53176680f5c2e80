// Package atomicfile owns the one way both binaries replace files that must
// never be seen half-written (kubeconfigs, keys, configs, pod and shim
// state): write a temporary file beside the target, fsync it, rename it over
// the target, fsync the directory. It imports only the standard library's
// os and path/filepath, so the shim may link it.
package atomicfile

import (
	"os"
	"path/filepath"
)

// WriteFile replaces path with data and mode, creating missing parent
// directories with mode 0700. Readers see the old file or the new one,
// even after the machine crashes: the file and its directory are fsynced.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, true)
}

// WriteFileNoSync is WriteFile without the fsyncs, for state rewritten
// often whose loss in a machine crash is recovered otherwise: a crash of
// the process still leaves the old file or the new one, a crash of the
// machine may leave neither.
func WriteFileNoSync(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, false)
}

func write(path string, data []byte, mode os.FileMode, durable bool) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if durable {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	done = true
	if !durable {
		return nil
	}
	// The rename is done; a directory that cannot be synced (some
	// filesystems refuse) does not make it undone.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
