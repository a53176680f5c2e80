package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The store keeps every image's blobs (config and compressed layers, as a
// registry serves them) under blobs/sha256/<hex> next to its unpacked tree:
// save, push and the node-local registry read them, and a pull or push that
// meets a blob already there does not copy it again.

// Progress reports bytes transferred of total (0 while unknown).
type Progress func(done, total int64)

func (s *Store) blobPath(h v1.Hash) string { return filepath.Join(s.root, "blobs", h.Algorithm, h.Hex) }

// HasBlob reports a stored blob's size.
func (s *Store) HasBlob(h v1.Hash) (int64, bool) {
	fi, err := os.Stat(s.blobPath(h))
	if err != nil {
		return 0, false
	}
	return fi.Size(), true
}

// OpenBlob opens a stored blob.
func (s *Store) OpenBlob(h v1.Hash) (*os.File, error) { return os.Open(s.blobPath(h)) }

// PutBlob stores r as blob h, refusing content of another digest.
func (s *Store) PutBlob(h v1.Hash, r io.Reader) error {
	if h.Algorithm != "sha256" {
		return fmt.Errorf("blob %s: only sha256 digests are stored", h)
	}
	if _, ok := s.HasBlob(h); ok {
		_, err := io.Copy(io.Discard, r)
		return err
	}
	dir := filepath.Join(s.root, "blobs", "sha256")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	hash := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, hash), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if got := hex.EncodeToString(hash.Sum(nil)); got != h.Hex {
		return fmt.Errorf("blob content has digest sha256:%s, not %s", got, h)
	}
	return os.Rename(f.Name(), s.blobPath(h))
}

// writeBlobs copies img's config and layers into the store, skipping those
// present, and reports the bytes fetched.
func (s *Store) writeBlobs(ctx context.Context, img v1.Image, p Progress) error {
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	var total, done int64
	for _, l := range m.Layers {
		total += l.Size
	}
	total += m.Config.Size
	report := func() {
		if p != nil {
			p(done, total)
		}
	}
	report()
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	if err := s.PutBlob(m.Config.Digest, bytes.NewReader(cfg)); err != nil {
		return fmt.Errorf("config blob: %w", err)
	}
	done += m.Config.Size
	report()
	for _, d := range m.Layers {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if _, ok := s.HasBlob(d.Digest); ok {
			done += d.Size
			report()
			continue
		}
		l, err := img.LayerByDigest(d.Digest)
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		err = s.PutBlob(d.Digest, &countReader{r: rc, n: &done, report: report})
		rc.Close()
		if err != nil {
			return fmt.Errorf("layer %s: %w", d.Digest, err)
		}
	}
	report()
	return nil
}

type countReader struct {
	r      io.Reader
	n      *int64
	report func()
	last   time.Time
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	*c.n += int64(n)
	if now := time.Now(); now.Sub(c.last) > 100*time.Millisecond || err != nil {
		c.last = now
		c.report()
	}
	return n, err
}

// FromManifest is the image a raw manifest describes, read from the blobs.
func (s *Store) FromManifest(raw []byte) (v1.Image, error) {
	var m v1.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	mt := m.MediaType
	if mt == "" {
		mt = types.OCIManifestSchema1
	}
	if !mt.IsImage() {
		return nil, fmt.Errorf("manifest media type %s is not an image", mt)
	}
	cfg, err := os.ReadFile(s.blobPath(m.Config.Digest))
	if err != nil {
		return nil, fmt.Errorf("config blob %s: %w", m.Config.Digest, err)
	}
	return partial.CompressedToImage(&storedImage{s: s, raw: raw, m: &m, mt: mt, cfg: cfg})
}

// Image is the stored image id (sha256:<hex>) as a v1.Image, its layers
// read from the blobs. An image stored before blobs were kept has none:
// pull it again.
func (s *Store) Image(id string) (v1.Image, error) {
	hex := strings.TrimPrefix(id, "sha256:")
	raw, err := os.ReadFile(filepath.Join(s.root, "sha256", hex, "manifest.json"))
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", id, err)
	}
	img, err := s.FromManifest(raw)
	if err != nil {
		return nil, err
	}
	m, _ := img.Manifest()
	for _, l := range m.Layers {
		if _, ok := s.HasBlob(l.Digest); !ok {
			return nil, fmt.Errorf("image %s was stored without its layer blobs (before k3sm kept them): pull or load it again", id)
		}
	}
	return img, nil
}

type storedImage struct {
	s   *Store
	raw []byte
	m   *v1.Manifest
	mt  types.MediaType
	cfg []byte
}

func (i *storedImage) RawConfigFile() ([]byte, error)      { return i.cfg, nil }
func (i *storedImage) MediaType() (types.MediaType, error) { return i.mt, nil }
func (i *storedImage) RawManifest() ([]byte, error)        { return i.raw, nil }

func (i *storedImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, d := range append([]v1.Descriptor{i.m.Config}, i.m.Layers...) {
		if d.Digest == h {
			return &storedBlob{path: i.s.blobPath(h), d: d}, nil
		}
	}
	return nil, fmt.Errorf("blob %s is not in this image", h)
}

type storedBlob struct {
	path string
	d    v1.Descriptor
}

func (b *storedBlob) Digest() (v1.Hash, error)            { return b.d.Digest, nil }
func (b *storedBlob) Size() (int64, error)                { return b.d.Size, nil }
func (b *storedBlob) MediaType() (types.MediaType, error) { return b.d.MediaType, nil }
func (b *storedBlob) Compressed() (io.ReadCloser, error)  { return os.Open(b.path) }

// Add stores img (loaded, imported, built or pushed to the node's
// registry) under the given tags: its blobs are kept, its tree unpacked
// once per digest.
func (s *Store) Add(ctx context.Context, img v1.Image, tags []string, p Progress) (*Image, error) {
	var refs []name.Reference
	for _, t := range tags {
		r, err := name.NewTag(t)
		if err != nil {
			return nil, &InvalidNameError{Ref: t, Err: err}
		}
		refs = append(refs, r)
	}
	return s.add(ctx, img, refs, "", p)
}

// add checks the platform, keeps the blobs, unpacks from them and records
// the references (tags move; repoDigest, if set, is added).
func (s *Store) add(ctx context.Context, img v1.Image, refs []name.Reference, repoDigest string, p Progress) (*Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	label := "image"
	if len(refs) > 0 {
		label = refs[0].String()
	}
	if !runsOn(cf.OS, cf.Architecture, s.platform) {
		return nil, &PlatformError{Ref: label, Want: s.wantName(), Available: []string{platformName(cf.OS, cf.Architecture)}}
	}
	dg, err := img.Digest()
	if err != nil {
		return nil, err
	}
	if err := s.writeBlobs(ctx, img, p); err != nil {
		return nil, fmt.Errorf("store %s: %w", label, err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	local, err := s.FromManifest(raw)
	if err != nil {
		return nil, err
	}
	size, err := s.unpack(ctx, dg.Hex, local)
	if err != nil {
		return nil, fmt.Errorf("unpack %s: %w", label, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.images[dg.Hex]
	if !ok {
		rec = &Image{ID: dg.String(), Size: size, OS: cf.OS, Arch: cf.Architecture, Config: cf.Config}
		s.images[dg.Hex] = rec
	}
	for _, r := range refs {
		if _, isTag := r.(name.Tag); isTag {
			s.moveTagLocked(rec, r.Name())
		}
	}
	if repoDigest != "" && !contains(rec.RepoDigests, repoDigest) {
		rec.RepoDigests = append(rec.RepoDigests, repoDigest)
	}
	if err := s.saveLocked(); err != nil {
		return nil, err
	}
	c := *rec
	c.RootFS = s.rootfs(dg.Hex)
	return &c, nil
}

// moveTagLocked gives tag to rec, dropping it from whatever image had it.
func (s *Store) moveTagLocked(rec *Image, tag string) {
	for _, other := range s.images {
		other.RepoTags = without(other.RepoTags, tag)
	}
	rec.RepoTags = append(rec.RepoTags, tag)
}

// Resolve finds a stored image by reference, id or id prefix (12+ hex).
func (s *Store) Resolve(ref string) (*Image, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resolveLocked(ref)
}

// recordLocked is the stored record of the image ref names.
func (s *Store) recordLocked(ref string) (*Image, error) {
	img, ok := s.resolveLocked(ref)
	if !ok {
		return nil, fmt.Errorf("image %q: %w (see `k3sm image ls`)", ref, fs.ErrNotExist)
	}
	return s.images[strings.TrimPrefix(img.ID, "sha256:")], nil
}

func (s *Store) resolveLocked(ref string) (*Image, bool) {
	hexID := strings.TrimPrefix(ref, "sha256:")
	if len(hexID) >= 12 && isHex(hexID) {
		var found *Image
		for h, img := range s.images {
			if strings.HasPrefix(h, hexID) {
				if found != nil {
					return nil, false // ambiguous
				}
				c := *img
				c.RootFS = s.rootfs(h)
				found = &c
			}
		}
		if found != nil {
			return found, true
		}
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, false
	}
	return s.lookupLocked(r)
}

func isHex(s string) bool {
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// Tag gives the stored image source the tag target.
func (s *Store) Tag(source, target string) (*Image, error) {
	t, err := name.NewTag(target)
	if err != nil {
		return nil, &InvalidNameError{Ref: target, Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.recordLocked(source)
	if err != nil {
		return nil, err
	}
	s.moveTagLocked(rec, t.Name())
	if err := s.saveLocked(); err != nil {
		return nil, err
	}
	c := *rec
	return &c, nil
}

// Untag removes the tag ref; an image left with no tag, or one named by id
// or digest, is deleted with the blobs no other image uses. inUse, if set,
// refuses deleting an image a pod runs.
func (s *Store) Untag(ref string, inUse func(id string) error) (deleted bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.recordLocked(ref)
	if err != nil {
		return false, err
	}
	if r, err := name.ParseReference(ref); err == nil {
		if _, isTag := r.(name.Tag); isTag && contains(rec.RepoTags, r.Name()) && len(rec.RepoTags) > 1 {
			rec.RepoTags = without(rec.RepoTags, r.Name())
			return false, s.saveLocked()
		}
	}
	if inUse != nil {
		if err := inUse(rec.ID); err != nil {
			return false, err
		}
	}
	return true, s.deleteLocked(strings.TrimPrefix(rec.ID, "sha256:"))
}

// deleteLocked drops an image, its tree and the blobs only it referenced.
func (s *Store) deleteLocked(hex string) error {
	delete(s.images, hex)
	if err := s.saveLocked(); err != nil {
		return err
	}
	mine := s.blobsOf(hex)
	if err := os.RemoveAll(filepath.Join(s.root, "sha256", hex)); err != nil {
		return err
	}
	used := s.referencedLocked()
	for h := range mine {
		if !used[h] {
			os.Remove(s.blobPath(h))
		}
	}
	return nil
}

// blobsOf lists the blobs the stored manifest of hex references.
func (s *Store) blobsOf(hex string) map[v1.Hash]bool {
	out := map[v1.Hash]bool{}
	raw, err := os.ReadFile(filepath.Join(s.root, "sha256", hex, "manifest.json"))
	if err != nil {
		return out
	}
	var m v1.Manifest
	if json.Unmarshal(raw, &m) != nil {
		return out
	}
	out[m.Config.Digest] = true
	for _, l := range m.Layers {
		out[l.Digest] = true
	}
	return out
}

func (s *Store) referencedLocked() map[v1.Hash]bool {
	used := map[v1.Hash]bool{}
	for h := range s.images {
		for b := range s.blobsOf(h) {
			used[b] = true
		}
	}
	s.pinnedLocked(used)
	return used
}

// PruneResult is what a prune removed (or would remove, on a dry run).
type PruneResult struct {
	Removed []*Image
	Freed   uint64
}

// Prune deletes the images keep refuses (keep reports true for images to
// keep), then blobs no image references that are older than an hour (a
// younger one may be a push in progress). dryRun only counts.
func (s *Store) Prune(keep func(img *Image) bool, dryRun bool) (PruneResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var res PruneResult
	gone := map[string]bool{}
	for hex, img := range s.images {
		if keep(img) {
			continue
		}
		c := *img
		res.Removed = append(res.Removed, &c)
		res.Freed += uint64(dirSize(filepath.Join(s.root, "sha256", hex)))
		gone[hex] = true
	}
	used := map[v1.Hash]bool{}
	for h := range s.images {
		if !gone[h] {
			for b := range s.blobsOf(h) {
				used[b] = true
			}
		}
	}
	s.pinnedLocked(used)
	blobs, _ := os.ReadDir(filepath.Join(s.root, "blobs", "sha256"))
	var orphans []v1.Hash
	for _, e := range blobs {
		h := v1.Hash{Algorithm: "sha256", Hex: e.Name()}
		fi, err := e.Info()
		if err != nil || used[h] || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		// Blobs of a removed image go at once; strays only when old.
		if !s.removedBlob(gone, h) && time.Since(fi.ModTime()) < time.Hour {
			continue
		}
		res.Freed += uint64(fi.Size())
		orphans = append(orphans, h)
	}
	if dryRun {
		return res, nil
	}
	for hex := range gone {
		delete(s.images, hex)
	}
	if err := s.saveLocked(); err != nil {
		return res, err
	}
	var errs []error
	for hex := range gone {
		errs = append(errs, os.RemoveAll(filepath.Join(s.root, "sha256", hex)))
	}
	for _, h := range orphans {
		errs = append(errs, os.Remove(s.blobPath(h)))
	}
	return res, errors.Join(errs...)
}

func (s *Store) removedBlob(gone map[string]bool, h v1.Hash) bool {
	for hex := range gone {
		if s.blobsOf(hex)[h] {
			return true
		}
	}
	return false
}

// ManifestOf returns the raw manifest and config of a stored image.
func (s *Store) ManifestOf(id string) (manifest, config []byte, err error) {
	dir := filepath.Join(s.root, "sha256", strings.TrimPrefix(id, "sha256:"))
	if manifest, err = os.ReadFile(filepath.Join(dir, "manifest.json")); err != nil {
		return nil, nil, err
	}
	config, err = os.ReadFile(filepath.Join(dir, "config.json"))
	return manifest, config, err
}
