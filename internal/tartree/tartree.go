// Package tartree owns the one walk that packs a directory tree into a tar
// stream, as an image layer holds it: each file in lexical order, symlinks
// as symlinks, directories with a trailing slash, regular files with their
// content, everything owned by root unless the caller says otherwise. The
// callers choose where the tree lands in the archive, which files are left
// out, and what else each header says (owner, mode, time). Standard
// library only.
package tartree

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// SkipEntry, returned by Options.Skip, leaves a file's entry out of the
// archive; a directory's contents are still walked.
var SkipEntry = errors.New("skip this entry")

// Options are a caller's choices; the zero value packs every file, owned by
// root, with its mode and modification time.
type Options struct {
	// Skip, when set, is asked about each file (root too) before its
	// entry is written. SkipEntry leaves the entry out, filepath.SkipDir
	// a directory with everything in it (on a file, as with
	// filepath.WalkDir, the rest of its directory); any other error stops
	// the walk.
	Skip func(path string, d fs.DirEntry) error
	// Header, when set, adjusts each header (owner, mode, time) just
	// before it is written; an error stops the walk.
	Header func(h *tar.Header) error
}

// Write packs the tree at root (a directory or a single file) into tw, as
// prefix: a file under root is named prefix joined with its path below
// root, without a leading slash. The entry of root itself is prefix's;
// with an empty prefix, root's contents are the archive's top and root
// has no entry.
func Write(tw *tar.Writer, root, prefix string, o Options) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root && prefix == "" {
			return nil
		}
		if o.Skip != nil {
			switch err := o.Skip(p, d); {
			case err == SkipEntry:
				return nil
			case err != nil:
				return err
			}
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		h.Name = strings.TrimPrefix(path.Join(prefix, filepath.ToSlash(rel)), "/")
		if info.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		if o.Header != nil {
			if err := o.Header(h); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
}
