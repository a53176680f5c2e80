// Package clone owns materializing a pod's root from an unpacked image:
// a copy-on-write clone of a directory tree where the filesystem supports it
// (FICLONE reflinks on Linux, clonefile on darwin), a plain copy otherwise.
package clone

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Method says how a tree (or file) was materialized.
type Method string

const (
	Reflink   Method = "reflink"   // Linux FICLONE: extents shared until written
	Clonefile Method = "clonefile" // darwin clonefile(2) of the whole tree
	Copy      Method = "copy"      // bytes copied
)

// Tree materializes a copy of the directory src at dst (which must not
// exist), cloning file contents when the filesystem allows. It returns the
// method used for the file contents (Copy if any file had to be copied).
func Tree(src, dst string) (Method, error) {
	if _, err := os.Lstat(dst); err == nil {
		return "", fmt.Errorf("clone: destination %s already exists", dst)
	}
	if m, ok, err := treeNative(src, dst); ok || err != nil {
		return m, err
	}
	// Once a file could not be cloned, the rest of the tree (same
	// filesystems) cannot either: stop trying, each try costs a create,
	// an ioctl and a remove.
	noClone := false
	return walk(src, dst, func(s, d string, mode fs.FileMode) (Method, error) {
		if noClone {
			return Copy, copyFile(s, d, mode)
		}
		ok, err := reflinkFile(s, d, mode)
		if ok {
			return Reflink, nil
		}
		if err != nil && !unsupported(err) {
			return "", err
		}
		noClone = true
		return Copy, copyFile(s, d, mode)
	})
}

// walk recreates the tree, calling file for each regular file. Directories
// and symlinks are recreated; hard links become independent files; device
// nodes, fifos and sockets are skipped (pods run unprivileged).
func walk(src, dst string, file func(s, d string, mode fs.FileMode) (Method, error)) (Method, error) {
	method := Method("")
	type dirTime struct {
		path string
		mt   time.Time
	}
	var dirs []dirTime
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()|0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirTime{target, info.ModTime()})
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			m, err := file(p, target, info.Mode())
			if err != nil {
				return err
			}
			if method == "" || m == Copy {
				method = m
			}
			_ = os.Chtimes(target, info.ModTime(), info.ModTime())
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("clone %s -> %s: %w", src, dst, err)
	}
	// Directory permissions and times last: writing into them changed both.
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Chtimes(dirs[i].path, dirs[i].mt, dirs[i].mt)
	}
	if method == "" {
		method = Copy
	}
	return method, nil
}

// copyFile copies one file. It holds syscall.ForkLock for reading while the
// destination is open for writing: a process forked meanwhile would inherit
// the write descriptor until it execs, and exec'ing the copied binary during
// that window fails with ETXTBSY (golang.org/issue/22315).
func copyFile(src, dst string, mode fs.FileMode) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(mode.Perm()); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// unsupported reports errors that mean "this filesystem cannot clone".
func unsupported(err error) bool {
	return errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOTSUP) ||
		errors.Is(err, syscall.EXDEV) || errors.Is(err, syscall.EINVAL) ||
		errors.Is(err, syscall.ENOTTY) || errors.Is(err, syscall.ENOSYS) || errors.Is(err, errNoClone)
}

var errNoClone = errors.New("clone: not supported on this platform")

// Probe reports which method Tree would use for files created in dir, by
// cloning a small scratch file there.
func Probe(dir string) Method {
	tmp, err := os.MkdirTemp(dir, ".clone-probe-")
	if err != nil {
		return Copy
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "a")
	if err := os.WriteFile(src, []byte("k3sm clone probe"), 0o600); err != nil {
		return Copy
	}
	if m, ok, _ := treeNative(src, filepath.Join(tmp, "b")); ok {
		return m
	}
	if ok, _ := reflinkFile(src, filepath.Join(tmp, "c"), 0o600); ok {
		return Reflink
	}
	return Copy
}
