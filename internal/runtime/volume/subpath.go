package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// SubPath resolves a volumeMount's subPath inside the volume directory
// volumeDir and returns the resolved path (symlinks evaluated) to bind-mount.
//
// sub must be relative, with "/" separators and no ".." component; an error
// naming the subPath is returned otherwise. "" (and ".") resolve to the
// volume directory itself. The path is walked one component at a time from
// the resolved volume directory: each symlink met is evaluated
// (filepath.EvalSymlinks) and must stay inside the volume, or the walk stops
// with an error naming the subPath and where it leads; a symlink into the
// volume is fine (a configMap key, dir/key -> ..data/key, resolves to the
// file in the current payload directory, as the kubelet's does). A missing
// component is created as a directory 0755 (whatever the umask) when create
// is true, as the kubelet does for subPath mounts, and is an error otherwise.
// The last component may be any kind of file; the others must be
// directories.
//
// The check is path-based: a process with write access to the volume that
// swaps a directory for a symlink between this call and the bind mount can
// still redirect it (the kubelet closes that window by mounting through
// /proc/self/fd of a safely opened descriptor). Callers should mount the
// returned path promptly and, where it matters, before the pod's
// containers run.
func SubPath(volumeDir, sub string, create bool) (string, error) {
	if filepath.IsAbs(sub) || strings.HasPrefix(sub, "/") {
		return "", fmt.Errorf("subPath %q must be a relative path", sub)
	}
	if strings.ContainsRune(sub, 0) {
		return "", fmt.Errorf("subPath %q contains NUL", sub)
	}
	for _, c := range strings.Split(filepath.ToSlash(sub), "/") {
		if c == ".." {
			return "", fmt.Errorf("subPath %q must not contain \"..\" components", sub)
		}
	}
	root, err := filepath.EvalSymlinks(volumeDir)
	if err != nil {
		return "", fmt.Errorf("subPath %q: volume directory: %w", sub, err)
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("subPath %q: volume %s is not a directory", sub, volumeDir)
	}
	var comps []string
	for _, c := range strings.Split(filepath.ToSlash(sub), "/") {
		if c != "" && c != "." {
			comps = append(comps, c)
		}
	}
	cur := root
	for i := 0; i < len(comps); i++ {
		next := filepath.Join(cur, comps[i])
		last := i == len(comps)-1
		fi, err := os.Lstat(next)
		if errors.Is(err, fs.ErrNotExist) {
			if !create {
				return "", fmt.Errorf("subPath %q: %s does not exist", sub, next)
			}
			if err := os.Mkdir(next, 0o755); err != nil {
				if errors.Is(err, fs.ErrExist) {
					i-- // created meanwhile: look at it again
					continue
				}
				return "", fmt.Errorf("subPath %q: %w", sub, err)
			}
			if err := os.Chmod(next, 0o755); err != nil {
				return "", fmt.Errorf("subPath %q: %w", sub, err)
			}
			// Owned as the directory it is made in: in a volume given to
			// the pod's user namespace, the pod's root can write in it, as
			// the container's root can in the kubelet's.
			if err := chownLike(next, cur); err != nil {
				return "", fmt.Errorf("subPath %q: %w", sub, err)
			}
			cur = next
			continue
		}
		if err != nil {
			return "", fmt.Errorf("subPath %q: %w", sub, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			r, err := filepath.EvalSymlinks(next)
			if err != nil {
				return "", fmt.Errorf("subPath %q: symlink %s: %w", sub, next, err)
			}
			if !inside(root, r) {
				return "", fmt.Errorf("subPath %q resolves to %s, outside the volume %s", sub, r, volumeDir)
			}
			next = r
			if fi, err = os.Stat(r); err != nil {
				return "", fmt.Errorf("subPath %q: %w", sub, err)
			}
		}
		if !last && !fi.IsDir() {
			return "", fmt.Errorf("subPath %q: %s is not a directory", sub, next)
		}
		cur = next
	}
	return cur, nil
}

// inside reports whether p is root or under it (both clean and absolute).
func inside(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return false
	}
	return rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// chownLike gives path the owner and group of ref, when they differ.
func chownLike(path, ref string) error {
	var a, b syscall.Stat_t
	if err := syscall.Lstat(path, &a); err != nil {
		return err
	}
	if err := syscall.Stat(ref, &b); err != nil {
		return err
	}
	if a.Uid == b.Uid && a.Gid == b.Gid {
		return nil
	}
	return os.Lchown(path, int(b.Uid), int(b.Gid))
}
