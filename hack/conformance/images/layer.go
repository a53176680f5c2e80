//go:build linux

package main

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is the modification time of the files our own layers add, so a
// rebuild from the same inputs gives the same digests.
var epoch = time.Unix(0, 0)

// entry is one file of a layer we compose.
type entry struct {
	name     string // path in the image, relative ("usr/local/bin/nnp")
	mode     int64  // permission and setuid/setgid/sticky bits
	uid, gid int
	data     []byte // regular file content...
	src      string // ...or a file on disk
	link     string // symlink target
	dir      bool
}

// createLayer writes a gzipped layer tarball at dst (through a temporary
// file, so a stopped build never leaves a truncated layer) with fill
// writing the entries.
func createLayer(dst string, fill func(tw *tar.Writer) error) error {
	tmp := dst + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	defer f.Close()
	zw, err := gzip.NewWriterLevel(f, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	if err := fill(tw); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// writeEntries writes entries, sorted by name so parents come first. It
// adds no parent directories of its own: a layer on the Debian rootfs must
// not replace its /bin -> usr/bin symlink by a directory, so layers that
// stand alone list their directories.
func writeEntries(tw *tar.Writer, entries []entry) error {
	sorted := append([]entry(nil), entries...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	for _, e := range sorted {
		name := strings.TrimPrefix(e.name, "/")
		hdr := &tar.Header{Name: name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case e.dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
			if hdr.Mode == 0 {
				hdr.Mode = 0o755
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case e.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, e.link, 0o777
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case e.src != "":
			if err := writeFile(tw, hdr, e.src); err != nil {
				return err
			}
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(e.data))
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := tw.Write(e.data); err != nil {
				return err
			}
		}
	}
	return nil
}

func writeFile(tw *tar.Writer, hdr *tar.Header, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, f)
	if err == nil && n != st.Size() {
		err = fmt.Errorf("%s changed size while being read", src)
	}
	return err
}

// writeTree writes the directory tree root as a layer: modes (with
// setuid, setgid and sticky bits), numeric owners, symlinks, hard links
// (as tar links to the first name) and the security.capability xattr are
// kept; devices, sockets and the contents of the directories in
// skipContents (dev, proc, sys) are left out: a pod gets those from its
// sandbox.
func writeTree(tw *tar.Writer, root string, skipContents map[string]bool) error {
	type inode struct{ dev, ino uint64 }
	first := map[inode]string{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if i := strings.IndexByte(rel, '/'); i > 0 && skipContents[rel[:i]] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat_t", p)
		}
		hdr := &tar.Header{
			Name:    rel,
			Mode:    int64(fi.Mode().Perm()),
			Uid:     int(st.Uid),
			Gid:     int(st.Gid),
			ModTime: fi.ModTime().Truncate(time.Second),
			Format:  tar.FormatPAX,
		}
		if fi.Mode()&fs.ModeSetuid != 0 {
			hdr.Mode |= 0o4000
		}
		if fi.Mode()&fs.ModeSetgid != 0 {
			hdr.Mode |= 0o2000
		}
		if fi.Mode()&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		switch {
		case fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
			return tw.WriteHeader(hdr)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
			return tw.WriteHeader(hdr)
		case fi.Mode().IsRegular():
			if st.Nlink > 1 {
				key := inode{uint64(st.Dev), uint64(st.Ino)}
				if prev, ok := first[key]; ok {
					hdr.Typeflag, hdr.Linkname = tar.TypeLink, prev
					return tw.WriteHeader(hdr)
				}
				first[key] = rel
			}
			if capability, err := getxattr(p, "security.capability"); err == nil && len(capability) > 0 {
				hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": string(capability)}
			}
			return writeFile(tw, hdr, p)
		default:
			// Devices, FIFOs, sockets: never needed from the image.
			return nil
		}
	})
}

func getxattr(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := syscall.Getxattr(p, name, buf)
		if err == syscall.ERANGE {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// openLayer opens a layer tarball we wrote; its digest and diff ID are
// computed once here, then every image using the same v1.Layer shares
// them.
func openLayer(p string) (v1.Layer, error) {
	l, err := tarball.LayerFromFile(p)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", p, err)
	}
	if _, err := l.Digest(); err != nil {
		return nil, fmt.Errorf("layer %s: %w", p, err)
	}
	if _, err := l.DiffID(); err != nil {
		return nil, fmt.Errorf("layer %s: %w", p, err)
	}
	return l, nil
}
