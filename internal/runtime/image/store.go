// Package image owns the node's image store: pulling OCI images for the host
// platform with go-containerregistry (mirrors, plain-HTTP endpoints and
// credentials from a registries file and the pod's pull secrets), unpacking
// each image once per digest under <data>/images, and the kubelet's pull
// policy rules. Pod roots are cloned from the unpacked trees.
package image

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

// Image is an image present in the store.
type Image struct {
	// ID is sha256:<hex> of the platform image's manifest.
	ID          string   `json:"id"`
	RepoTags    []string `json:"repoTags,omitempty"`
	RepoDigests []string `json:"repoDigests,omitempty"`
	Size        int64    `json:"size"`
	OS          string   `json:"os"`
	Arch        string   `json:"arch"`
	// Config is the image's run configuration (entrypoint, cmd, env ...).
	Config v1.Config `json:"config"`
	// RootFS is the unpacked tree (set on lookup, not stored).
	RootFS string `json:"-"`
}

// InvalidNameError is a reference that cannot be parsed (InvalidImageName).
type InvalidNameError struct {
	Ref string
	Err error
}

func (e *InvalidNameError) Error() string {
	return fmt.Sprintf("failed to parse image reference %q: %v", e.Ref, e.Err)
}

// PlatformError is an image that has no variant for this host.
type PlatformError struct {
	Ref       string
	Want      string
	Available []string // os/arch of each image offered
}

func (e *PlatformError) Error() string {
	if len(e.Available) == 0 {
		return fmt.Sprintf("image %q offers no image for any platform, so none for this node's platform %s: build or pull an image for %s",
			e.Ref, e.Want, e.Want)
	}
	return fmt.Sprintf("image %q is for %s, not for this node's platform %s: build or pull an image for %s",
		e.Ref, strings.Join(e.Available, ", "), e.Want, e.Want)
}

// runsOn reports whether an image that says it is for os/arch runs on
// platform p. An empty field says nothing: tools that assemble images from
// layers (crane append, some build scripts) leave the config's os and
// architecture unset, and containerd runs such a single-platform image.
func runsOn(os, arch string, p v1.Platform) bool {
	return (os == "" || os == p.OS) && (arch == "" || arch == p.Architecture)
}

// platformName is os/arch, with "?" for what an image leaves unsaid.
func platformName(os, arch string) string {
	if os == "" {
		os = "?"
	}
	if arch == "" {
		arch = "?"
	}
	return os + "/" + arch
}

// Store is the content-addressed image store under one directory.
type Store struct {
	root       string
	registries *Registries
	platform   v1.Platform

	mu     sync.Mutex
	images map[string]*Image // by hex digest
	locks  map[string]*sync.Mutex
	pins   func() map[v1.Hash]bool // see PinBlobs
}

const indexFile = "index.json"

// NewStore opens (creating) the store at root. registries may be nil.
func NewStore(root string, registries *Registries) (*Store, error) {
	if registries == nil {
		registries = &Registries{}
	}
	for _, d := range []string{root, filepath.Join(root, "sha256"), filepath.Join(root, "tmp"), filepath.Join(root, "blobs", "sha256")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	s := &Store{root: root, registries: registries, images: map[string]*Image{}, locks: map[string]*sync.Mutex{},
		platform: v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}}
	// Leftovers of an unpack interrupted by a crash.
	tmps, _ := os.ReadDir(filepath.Join(root, "tmp"))
	for _, t := range tmps {
		os.RemoveAll(filepath.Join(root, "tmp", t.Name()))
	}
	b, err := os.ReadFile(filepath.Join(root, indexFile))
	if err == nil {
		if err := json.Unmarshal(b, &s.images); err != nil {
			return nil, fmt.Errorf("image index %s: %w", filepath.Join(root, indexFile), err)
		}
	} else if !os.IsNotExist(err) {
		return nil, err
	}
	for hex := range s.images {
		if _, err := os.Stat(s.rootfs(hex)); err != nil {
			delete(s.images, hex)
		}
	}
	return s, nil
}

// PinBlobs makes pinned's blobs used as if an image held them, so neither
// Prune nor an image's deletion removes them: the node-local registry's
// manifests that are no image of the store (indexes' platforms, digest-only
// pushes, artifacts). pinned must not call the store.
func (s *Store) PinBlobs(pinned func() map[v1.Hash]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pins = pinned
}

func (s *Store) pinnedLocked(used map[v1.Hash]bool) {
	if s.pins == nil {
		return
	}
	for h := range s.pins() {
		used[h] = true
	}
}

// SetPlatform overrides the host platform (tests).
func (s *Store) SetPlatform(p v1.Platform) { s.platform = p }

func (s *Store) rootfs(hex string) string { return filepath.Join(s.root, "sha256", hex, "rootfs") }

func (s *Store) saveLocked() error {
	b, err := json.MarshalIndent(s.images, "", " ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFileNoSync(filepath.Join(s.root, indexFile), b, 0o600)
}

// ParseRef parses an image reference the way the store does.
func ParseRef(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, &InvalidNameError{Ref: ref, Err: err}
	}
	return r, nil
}

// DefaultPullAlways reports the kubelet's default policy for ref: Always for
// :latest or an untagged reference not pinned by digest.
func DefaultPullAlways(ref string) bool {
	if strings.Contains(ref, "@") {
		return false
	}
	last := ref[strings.LastIndex(ref, "/")+1:]
	i := strings.LastIndex(last, ":")
	return i < 0 || last[i+1:] == "latest"
}

// Lookup finds ref in the store.
func (s *Store) Lookup(ref string) (*Image, bool) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookupLocked(r)
}

func (s *Store) lookupLocked(r name.Reference) (*Image, bool) {
	want := r.Name()
	for hex, img := range s.images {
		list := img.RepoTags
		if _, ok := r.(name.Digest); ok {
			list = img.RepoDigests
			if "sha256:"+hex == r.Identifier() {
				c := *img
				c.RootFS = s.rootfs(hex)
				return &c, true
			}
		}
		for _, n := range list {
			if n == want {
				c := *img
				c.RootFS = s.rootfs(hex)
				return &c, true
			}
		}
	}
	return nil, false
}

// Get returns the image with id (sha256:<hex>).
func (s *Store) Get(id string) (*Image, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	hex := strings.TrimPrefix(id, "sha256:")
	img, ok := s.images[hex]
	if !ok {
		return nil, false
	}
	c := *img
	c.RootFS = s.rootfs(hex)
	return &c, true
}

// List returns every image.
func (s *Store) List() []*Image {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Image
	for hex, img := range s.images {
		c := *img
		c.RootFS = s.rootfs(hex)
		out = append(out, &c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Remove deletes an image (by reference or id) and its unpacked tree. Pod
// roots cloned from it are independent and stay.
func (s *Store) Remove(ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	hex := ""
	if img, ok := s.images[strings.TrimPrefix(ref, "sha256:")]; ok {
		hex = strings.TrimPrefix(img.ID, "sha256:")
	} else if r, err := name.ParseReference(ref); err == nil {
		if img, ok := s.lookupLocked(r); ok {
			hex = strings.TrimPrefix(img.ID, "sha256:")
		}
	}
	if hex == "" {
		return fmt.Errorf("image %q: %w", ref, fs.ErrNotExist)
	}
	return s.deleteLocked(hex)
}

// Pull fetches ref for the host platform, trying the registry's mirrors
// first, unpacks it if this digest is new, and records the reference.
func (s *Store) Pull(ctx context.Context, ref string, secrets [][]byte) (*Image, error) {
	return s.PullProgress(ctx, ref, secrets, nil)
}

// PullProgress is Pull reporting the bytes fetched to p.
func (s *Store) PullProgress(ctx context.Context, ref string, secrets [][]byte, p Progress) (*Image, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, ep := range s.registries.endpoints(r.Context().Registry) {
		img, err := s.pullFrom(ctx, r, ep, secrets, p)
		if err == nil {
			return img, nil
		}
		var pe *PlatformError
		if errors.As(err, &pe) || ctx.Err() != nil {
			return nil, err
		}
		errs = append(errs, err)
	}
	if len(errs) == 1 {
		return nil, errs[0]
	}
	return nil, errors.Join(errs...)
}

func (s *Store) pullFrom(ctx context.Context, r name.Reference, ep endpoint, secrets [][]byte, p Progress) (*Image, error) {
	// The same repository and tag/digest at the endpoint.
	repo := ep.registry.Repo(r.Context().RepositoryStr())
	var at name.Reference = repo.Tag(r.Identifier())
	if d, ok := r.(name.Digest); ok {
		at = repo.Digest(d.DigestStr())
	}
	auth, err := s.registries.authFor(ep.host, secrets)
	if err != nil {
		return nil, err
	}
	tr, err := s.registries.transport(ep.host)
	if err != nil {
		return nil, err
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuth(auth), remote.WithTransport(tr),
		remote.WithRetryBackoff(remote.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 2})}
	desc, err := remote.Get(at, opts...)
	if err != nil {
		return nil, describe(r.String(), ep.host, err)
	}
	var img v1.Image
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, err
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		if img, err = s.choose(r, idx, im); err != nil {
			return nil, err
		}
	} else if desc.MediaType == types.DockerManifestSchema1 || desc.MediaType == types.DockerManifestSchema1Signed {
		return nil, fmt.Errorf("image %q uses the retired Docker schema 1 manifest; push it again with a current tool", r.String())
	} else if img, err = desc.Image(); err != nil {
		return nil, err
	}
	if _, err := img.ConfigFile(); err != nil {
		return nil, describe(r.String(), ep.host, err)
	}
	// Recorded under the name the pod used, not the mirror's.
	repoDigest := r.Context().Digest(desc.Digest.String()).Name()
	return s.add(ctx, img, []name.Reference{r}, repoDigest, p)
}

func (s *Store) wantName() string { return platformName(s.platform.OS, s.platform.Architecture) }

// choose picks the index's image for the host platform by the platform
// each entry declares. An entry that declares none is an image only if its
// media type says so (attestations and other artifacts are skipped), and
// is then judged by its config, as containerd does.
func (s *Store) choose(r name.Reference, idx v1.ImageIndex, im *v1.IndexManifest) (v1.Image, error) {
	var avail []string
	var undeclared []v1.Hash
	for _, m := range im.Manifests {
		switch {
		case m.Platform == nil:
			if m.MediaType.IsImage() {
				undeclared = append(undeclared, m.Digest)
			}
		case m.Platform.OS == "unknown": // buildkit's attestations
		case m.Platform.OS == s.platform.OS && m.Platform.Architecture == s.platform.Architecture:
			return idx.Image(m.Digest)
		default:
			avail = append(avail, platformName(m.Platform.OS, m.Platform.Architecture))
		}
	}
	for _, dg := range undeclared {
		img, err := idx.Image(dg)
		if err != nil {
			return nil, err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		if runsOn(cf.OS, cf.Architecture, s.platform) {
			return img, nil
		}
		avail = append(avail, platformName(cf.OS, cf.Architecture))
	}
	return nil, &PlatformError{Ref: r.String(), Want: s.wantName(), Available: avail}
}

// describe turns registry errors into the messages a user acts on.
func describe(ref, host string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case 404:
			return fmt.Errorf("image %q not found at %s (manifest unknown): check the name and tag", ref, host)
		case 401, 403:
			return fmt.Errorf("pull access denied for %q at %s: add an imagePullSecret or registries credentials: %w", ref, host, err)
		}
	}
	return fmt.Errorf("pull %q from %s: %w", ref, host, err)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func without(list []string, s string) []string {
	out := list[:0]
	for _, x := range list {
		if x != s {
			out = append(out, x)
		}
	}
	return out
}

func (s *Store) lock(hex string) *sync.Mutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.locks[hex]
	if !ok {
		l = &sync.Mutex{}
		s.locks[hex] = l
	}
	return l
}

// unpack extracts img's flattened filesystem once per digest.
func (s *Store) unpack(ctx context.Context, hex string, img v1.Image) (int64, error) {
	l := s.lock(hex)
	l.Lock()
	defer l.Unlock()
	final := filepath.Join(s.root, "sha256", hex)
	if _, err := os.Stat(filepath.Join(final, "rootfs")); err == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if rec, ok := s.images[hex]; ok {
			return rec.Size, nil
		}
		return dirSize(filepath.Join(final, "rootfs")), nil
	}
	tmp, err := os.MkdirTemp(filepath.Join(s.root, "tmp"), hex[:12]+"-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return 0, err
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	size, err := untar(ctx, tar.NewReader(rc), rootfs)
	if err != nil {
		return 0, err
	}
	if m, err := img.RawManifest(); err == nil {
		os.WriteFile(filepath.Join(tmp, "manifest.json"), m, 0o600)
	}
	if c, err := img.RawConfigFile(); err == nil {
		os.WriteFile(filepath.Join(tmp, "config.json"), c, 0o600)
	}
	os.RemoveAll(final)
	if err := os.Rename(tmp, final); err != nil {
		return 0, err
	}
	return size, nil
}

func dirSize(root string) int64 {
	var n int64
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if i, err := d.Info(); err == nil {
				n += i.Size()
			}
		}
		return nil
	})
	return n
}

// untar writes a flattened layer stream under root. Entries may not escape
// root, neither by ".." nor through a symlink laid down earlier.
func untar(ctx context.Context, tr *tar.Reader, root string) (int64, error) {
	var size int64
	for {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		h, err := tr.Next()
		if err == io.EOF {
			return size, nil
		}
		if err != nil {
			return 0, err
		}
		rel := filepath.Clean("/" + h.Name)
		if rel == "/" {
			continue
		}
		target := filepath.Join(root, rel)
		if err := checkParents(root, rel); err != nil {
			return 0, fmt.Errorf("layer entry %q: %w", h.Name, err)
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return 0, err
		}
		mode := fs.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(target); err == nil && !fi.IsDir() {
				os.RemoveAll(target)
			}
			if err := os.Mkdir(target, mode|0o700); err != nil && !os.IsExist(err) {
				return 0, err
			}
			os.Chmod(target, mode|0o700)
		case tar.TypeReg:
			os.RemoveAll(target)
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return 0, err
			}
			n, err := io.Copy(f, tr)
			f.Close()
			if err != nil {
				return 0, err
			}
			size += n
			os.Chmod(target, mode)
			os.Chtimes(target, h.ModTime, h.ModTime)
		case tar.TypeSymlink:
			os.RemoveAll(target)
			if err := os.Symlink(h.Linkname, target); err != nil {
				return 0, err
			}
		case tar.TypeLink:
			src := filepath.Join(root, filepath.Clean("/"+h.Linkname))
			if err := checkParents(root, filepath.Clean("/"+h.Linkname)); err != nil {
				return 0, fmt.Errorf("layer hard link %q: %w", h.Name, err)
			}
			os.RemoveAll(target)
			if err := os.Link(src, target); err != nil {
				return 0, err
			}
		case tar.TypeFifo:
			os.RemoveAll(target)
			if err := mkfifo(target, uint32(mode)); err != nil {
				return 0, err
			}
			os.Chmod(target, mode)
		default:
			// Devices: a pod gets only the sandbox's /dev; skip.
			continue
		}
		if owner {
			// As root the layer's owners and special bits are kept: the
			// sandbox shows the image to a pod through an idmapped mount,
			// so uid 101 here is uid 101 in the pod.
			os.Lchown(target, h.Uid, h.Gid)
			if h.Typeflag == tar.TypeDir || h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeFifo {
				os.Chmod(target, h.FileInfo().Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
			}
		}
	}
}

// owner: unpacking as root reproduces ownership.
var owner = os.Geteuid() == 0

// checkParents refuses a path whose parent directories inside root include a
// symlink (which could point outside root).
func checkParents(root, rel string) error {
	parts := strings.Split(strings.Trim(filepath.Dir(rel), "/"), "/")
	p := root
	for _, part := range parts {
		if part == "" {
			continue
		}
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("path goes through symlink %s", strings.TrimPrefix(p, root))
		}
	}
	return nil
}

// FsInfo reports the store's usage and its filesystem's capacity.
type FsInfo struct {
	Mountpoint                                 string
	UsedBytes, InodesUsed, Capacity, Available uint64
}

// FsInfo walks the store.
func (s *Store) FsInfo() (FsInfo, error) {
	fi := FsInfo{Mountpoint: s.root}
	err := filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi.InodesUsed++
		if d.Type().IsRegular() {
			if i, err := d.Info(); err == nil {
				fi.UsedBytes += uint64(i.Size())
			}
		}
		return nil
	})
	if err != nil {
		return fi, err
	}
	fi.Capacity, fi.Available = statfs(s.root)
	return fi, nil
}
