// Package volume owns the on-disk content of a pod's volumes: the atomic
// payload writer behind configMap, secret, downwardAPI and projected volumes
// (WriteAtomic), the disk usage of an emptyDir for its sizeLimit (Usage), the
// hostPath type check (CheckHostPath) and the safe resolution of a
// volumeMount's subPath (SubPath). It links only the standard library.
package volume

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

const (
	// dataDirName is the symlink to the current payload directory.
	dataDirName = "..data"
	// newDataDirName is the temporary symlink renamed over dataDirName.
	newDataDirName = "..data_tmp"
	// tsLayout names a payload directory, as the kubelet does; a random
	// suffix is appended by os.MkdirTemp.
	tsLayout = "..2006_01_02_15_04_05."
	// defaultMode applies when File.Mode is 0.
	defaultMode os.FileMode = 0o644
	// modeBits are the bits a File.Mode may carry.
	modeBits = os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky
)

// File is one file of an atomic payload.
type File struct {
	// Path is relative to the volume directory, with "/" separators, in
	// clean form: no "." or ".." component, no leading "..", not absolute.
	Path    string
	Content []byte
	// Mode holds permission bits (plus setuid/setgid/sticky); 0 means 0644.
	// It is applied exactly, whatever the umask.
	Mode os.FileMode
}

// WriteAtomic makes dir hold exactly files, with the kubelet's AtomicWriter
// layout so that readers see an update all at once:
//
//	dir/..2026_12_01_05_48_44.123456789/<payload>   one payload directory
//	dir/..data -> ..2026_12_01_05_48_44.123456789  switched by rename(2)
//	dir/<key>  -> ..data/<key>                      one per top-level component
//
// The new payload is written to a fresh hidden directory, then a symlink
// ..data_tmp pointing at it is renamed over ..data, which is atomic; the
// user-visible symlinks of the new payload's top-level components are then
// created (an existing one never changes, since it goes through ..data) and
// stale ones left by an earlier payload are removed.
//
// The payload directory just replaced is not removed at once, as the
// kubelet does, but by the first call at least retiredGrace (5s) after the
// switch: its mtime is set to the switch time. Removing it at once fails
// readers: one that followed ..data just before the rename and is still
// inside that path lookup when the files are unlinked gets ENOENT, and the
// concurrent-reader test hits that within a few hundred updates on a loaded
// 2-CPU machine, even when removal waits for one further update. A lookup
// would now have to stall for seconds. Files are never modified in place,
// so a file once opened keeps its content.
//
// When the payload already on disk has the same paths, contents and modes,
// nothing is written and changed is false (missing user-visible symlinks and
// leftovers are still cleaned up). dir is created (0755, whatever the umask)
// if missing. A crash at any point leaves either the old or the new payload
// visible, and a later call cleans up the leftovers (..data_tmp, orphan
// payload directories). Nothing is fsynced: this survives the process dying,
// not the machine. Like the kubelet's, the writer assumes it is the only
// writer of dir (hidden "..*" directories in it are its own). An error after
// the switch (creating or removing user-visible symlinks) comes with
// changed=true: the new payload is already the one readers see.
func WriteAtomic(dir string, files []File) (changed bool, err error) {
	want, top, err := validatePayload(files)
	if err != nil {
		return false, err
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return false, err
		}
		// Whatever the umask: readers other than the owner traverse it.
		if err := os.Chmod(dir, 0o755); err != nil {
			return false, err
		}
	}
	// A crash between creating and renaming ..data_tmp leaves it behind.
	if err := os.Remove(filepath.Join(dir, newDataDirName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	oldTS, err := currentPayloadDir(dir)
	if err != nil {
		return false, err
	}
	// Something other than our symlink in the way of a user-visible path is
	// an error, found before anything is written.
	for _, name := range top {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err == nil && fi.Mode()&fs.ModeSymlink == 0 {
			return false, fmt.Errorf("volume %s: %s exists and is not a symlink into %s", dir, name, dataDirName)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
	}

	same := false
	if oldTS != "" {
		same, err = payloadEqual(filepath.Join(dir, oldTS), want)
		if err != nil {
			return false, err
		}
	}
	curTS := oldTS
	if !same {
		curTS, err = writePayload(dir, want)
		if err != nil {
			return false, err
		}
		tmp := filepath.Join(dir, newDataDirName)
		if err := os.Symlink(curTS, tmp); err != nil {
			os.RemoveAll(filepath.Join(dir, curTS))
			return false, err
		}
		if err := os.Rename(tmp, filepath.Join(dir, dataDirName)); err != nil {
			os.Remove(tmp)
			os.RemoveAll(filepath.Join(dir, curTS))
			return false, err
		}
		if oldTS != "" {
			// Starts the retired payload's grace period (best effort: if
			// this fails it goes sooner).
			now := time.Now()
			os.Chtimes(filepath.Join(dir, oldTS), now, now)
		}
	}
	if err := linkUserVisible(dir, top); err != nil {
		return !same, err
	}
	if err := removeStale(dir, top, curTS); err != nil {
		return !same, err
	}
	return !same, nil
}

// validatePayload checks the paths and returns the files by path (with the
// default mode applied) and the sorted top-level components.
func validatePayload(files []File) (map[string]File, []string, error) {
	want := make(map[string]File, len(files))
	topSet := map[string]bool{}
	for _, f := range files {
		p := f.Path
		switch {
		case p == "":
			return nil, nil, errors.New("volume payload: empty path")
		case strings.ContainsRune(p, 0):
			return nil, nil, fmt.Errorf("volume payload: path %q contains NUL", p)
		case path.IsAbs(p) || filepath.IsAbs(p):
			return nil, nil, fmt.Errorf("volume payload: path %q is absolute", p)
		case strings.HasPrefix(p, ".."):
			return nil, nil, fmt.Errorf("volume payload: path %q starts with \"..\"", p)
		}
		for _, c := range strings.Split(p, "/") {
			if c == ".." {
				return nil, nil, fmt.Errorf("volume payload: path %q has a \"..\" component", p)
			}
		}
		if path.Clean(p) != p || p == "." {
			return nil, nil, fmt.Errorf("volume payload: path %q is not clean (want %q)", p, path.Clean(p))
		}
		if _, dup := want[p]; dup {
			return nil, nil, fmt.Errorf("volume payload: duplicate path %q", p)
		}
		if f.Mode == 0 {
			f.Mode = defaultMode
		}
		if f.Mode&^modeBits != 0 {
			return nil, nil, fmt.Errorf("volume payload: path %q: mode %v is not permission bits", p, f.Mode)
		}
		want[p] = f
		topSet[strings.SplitN(p, "/", 2)[0]] = true
	}
	for p := range want {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, isFile := want[d]; isFile {
				return nil, nil, fmt.Errorf("volume payload: path %q is a file and the parent directory of %q", d, p)
			}
		}
	}
	top := make([]string, 0, len(topSet))
	for t := range topSet {
		top = append(top, t)
	}
	sort.Strings(top)
	return want, top, nil
}

// currentPayloadDir returns the name ..data points at, or "" when there is
// no ..data (or it points at something missing or foreign: a new payload is
// then written).
func currentPayloadDir(dir string) (string, error) {
	target, err := os.Readlink(filepath.Join(dir, dataDirName))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", dir, err)
	}
	if !strings.HasPrefix(target, "..") || strings.ContainsRune(target, '/') || target == dataDirName || target == newDataDirName {
		return "", nil
	}
	fi, err := os.Lstat(filepath.Join(dir, target))
	if err != nil || !fi.IsDir() {
		return "", nil
	}
	return target, nil
}

// payloadEqual reports whether the payload directory holds exactly want.
func payloadEqual(tsDir string, want map[string]File) (bool, error) {
	n := 0
	equal := true
	err := filepath.WalkDir(tsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(tsDir, p)
		if err != nil {
			return err
		}
		f, ok := want[filepath.ToSlash(rel)]
		if !ok || !d.Type().IsRegular() {
			equal = false
			return filepath.SkipAll
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&modeBits != f.Mode || fi.Size() != int64(len(f.Content)) {
			equal = false
			return filepath.SkipAll
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Equal(b, f.Content) {
			equal = false
			return filepath.SkipAll
		}
		n++
		return nil
	})
	if err != nil {
		return false, err
	}
	return equal && n == len(want), nil
}

// writePayload writes want into a fresh payload directory of dir and
// returns its name.
func writePayload(dir string, want map[string]File) (string, error) {
	tsDir, err := os.MkdirTemp(dir, time.Now().UTC().Format(tsLayout))
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		os.RemoveAll(tsDir)
		return "", err
	}
	// 0755 so that group and other can traverse it, as the kubelet does.
	if err := os.Chmod(tsDir, 0o755); err != nil {
		return fail(err)
	}
	made := map[string]bool{".": true}
	var mkdirs func(d string) error
	mkdirs = func(d string) error {
		if made[d] {
			return nil
		}
		if err := mkdirs(path.Dir(d)); err != nil {
			return err
		}
		full := filepath.Join(tsDir, filepath.FromSlash(d))
		if err := os.Mkdir(full, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(full, 0o755); err != nil {
			return err
		}
		made[d] = true
		return nil
	}
	for p, f := range want {
		if err := mkdirs(path.Dir(p)); err != nil {
			return fail(err)
		}
		full := filepath.Join(tsDir, filepath.FromSlash(p))
		fh, err := os.OpenFile(full, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fail(err)
		}
		_, err = fh.Write(f.Content)
		if err == nil {
			// After creation, so that the umask does not change it.
			err = fh.Chmod(f.Mode)
		}
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fail(err)
		}
	}
	return filepath.Base(tsDir), nil
}

// linkUserVisible makes dir/<name> -> ..data/<name> for each top-level
// component, replacing a symlink with another target atomically.
func linkUserVisible(dir string, top []string) error {
	for _, name := range top {
		link := filepath.Join(dir, name)
		target := dataDirName + "/" + name
		cur, err := os.Readlink(link)
		if err == nil && cur == target {
			continue
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("volume %s: %w", dir, err)
		}
		if err != nil {
			if err := os.Symlink(target, link); err != nil {
				return err
			}
			continue
		}
		tmp := filepath.Join(dir, newDataDirName)
		os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, link); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	return nil
}

// retiredGrace is how long a payload directory that is not current is kept
// after its last change (for the one just replaced: after the switch); a
// variable for the tests.
var retiredGrace = 5 * time.Second

// removeStale removes user-visible symlinks into ..data that are not in top
// and every hidden payload directory other than cur that is older than
// retiredGrace.
func removeStale(dir string, top []string, cur string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	inTop := make(map[string]bool, len(top))
	for _, t := range top {
		inTop[t] = true
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		full := filepath.Join(dir, name)
		switch {
		case name == dataDirName || name == cur:
		case name == newDataDirName:
			errs = append(errs, ignoreNotExist(os.Remove(full)))
		case strings.HasPrefix(name, ".."):
			if !e.IsDir() {
				continue
			}
			fi, err := e.Info()
			if err != nil || time.Since(fi.ModTime()) < retiredGrace {
				continue
			}
			errs = append(errs, ignoreNotExist(os.RemoveAll(full)))
		case !inTop[name] && e.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(full)
			if err == nil && strings.HasPrefix(target, dataDirName+"/") {
				errs = append(errs, ignoreNotExist(os.Remove(full)))
			}
		}
	}
	return errors.Join(errs...)
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
