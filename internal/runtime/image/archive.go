package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TempDir is where uploads are spooled (on the store's filesystem).
func (s *Store) TempDir() string { return filepath.Join(s.root, "tmp") }

// Load stores every image of a tarball: a docker-archive (`docker save`,
// manifest.json at the top) or an OCI image layout (oci-layout and
// index.json). tags name an archive's single image when it carries no name
// of its own, or add names to it.
func (s *Store) Load(ctx context.Context, path string, tags []string) ([]*Image, error) {
	names, err := tarNames(path)
	if err != nil {
		return nil, fmt.Errorf("read archive: %w (k3sm image load takes a `docker save` tarball or a tarred OCI layout)", err)
	}
	switch {
	case names["manifest.json"]:
		return s.loadDocker(ctx, path, tags)
	case names["index.json"] && names["oci-layout"]:
		dir, err := os.MkdirTemp(s.TempDir(), "layout-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		_, err = untar(ctx, tar.NewReader(f), dir)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("unpack OCI layout: %w", err)
		}
		return s.LoadLayout(ctx, dir, tags)
	}
	return nil, errors.New("archive has neither manifest.json (docker-archive, from `docker save`) nor oci-layout and index.json (OCI image layout) at its top")
}

func tarNames(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out[strings.TrimPrefix(filepath.Clean(h.Name), "./")] = true
	}
}

func (s *Store) loadDocker(ctx context.Context, path string, tags []string) ([]*Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, err
	}
	if len(tags) > 0 && len(m) != 1 {
		return nil, fmt.Errorf("--tag names one image, and the archive holds %d", len(m))
	}
	var out []*Image
	for _, d := range m {
		var img v1.Image
		var refs []string
		if len(d.RepoTags) == 0 {
			if len(m) != 1 {
				return nil, fmt.Errorf("archive entry %s has no name and is not alone in the archive: save the images with names", d.Config)
			}
			img, err = tarball.Image(opener, nil)
		} else {
			t, perr := name.NewTag(d.RepoTags[0])
			if perr != nil {
				return nil, &InvalidNameError{Ref: d.RepoTags[0], Err: perr}
			}
			img, err = tarball.Image(opener, &t)
			refs = d.RepoTags
		}
		if err != nil {
			return nil, err
		}
		rec, err := s.Add(ctx, img, append(refs, tags...), nil)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// refNameAnnotations name an image in an OCI layout's index: containerd
// writes the full name, the OCI spec often just the tag.
var refNameAnnotations = []string{"io.containerd.image.name", "org.opencontainers.image.ref.name"}

// LoadLayout stores the host platform's image of every entry of an OCI
// image layout directory.
func (s *Store) LoadLayout(ctx context.Context, dir string, tags []string) ([]*Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(tags) > 0 && len(im.Manifests) != 1 {
		return nil, fmt.Errorf("--tag names one image, and the layout's index lists %d", len(im.Manifests))
	}
	var out []*Image
	for _, d := range im.Manifests {
		var refs []string
		for _, a := range refNameAnnotations {
			if n := d.Annotations[a]; n != "" {
				if _, err := name.NewTag(n); err == nil && strings.ContainsAny(n, "/:") {
					refs = append(refs, n)
					break
				}
			}
		}
		refs = append(refs, tags...)
		var img v1.Image
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			cm, err := child.IndexManifest()
			if err != nil {
				return nil, err
			}
			label := d.Digest.String()
			if len(refs) > 0 {
				label = refs[0]
			}
			if img, err = s.choose(name.MustParseReference("layout/index"), child, cm); err != nil {
				return nil, fmt.Errorf("%s: %w", label, err)
			}
		case d.MediaType.IsImage():
			if img, err = idx.Image(d.Digest); err != nil {
				return nil, err
			}
		default:
			continue
		}
		rec, err := s.Add(ctx, img, refs, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("OCI layout %s lists no image", dir)
	}
	return out, nil
}

// Save writes the stored images refs as one docker-archive.
func (s *Store) Save(w io.Writer, refs []string) error {
	m := map[name.Reference]v1.Image{}
	for _, ref := range refs {
		rec, ok := s.Resolve(ref)
		if !ok {
			return fmt.Errorf("image %q is not in the store (see `k3sm image ls`)", ref)
		}
		img, err := s.Image(rec.ID)
		if err != nil {
			return err
		}
		tag := ref
		if r, err := name.NewTag(ref); err != nil || strings.HasPrefix(ref, "sha256:") || isHex(ref) {
			if len(rec.RepoTags) == 0 {
				return fmt.Errorf("image %s has no name to save it under: `k3sm image tag` it first", rec.ID)
			}
			tag = rec.RepoTags[0]
		} else {
			tag = r.Name()
		}
		t, err := name.NewTag(tag)
		if err != nil {
			return &InvalidNameError{Ref: tag, Err: err}
		}
		m[t] = img
	}
	return tarball.MultiRefWrite(m, w)
}

// Push writes the stored image ref to target (ref itself when empty),
// with the registries file's credentials and TLS settings for its host.
func (s *Store) Push(ctx context.Context, ref, target string, p Progress) error {
	rec, ok := s.Resolve(ref)
	if !ok {
		return fmt.Errorf("image %q is not in the store (see `k3sm image ls`)", ref)
	}
	if target == "" {
		target = ref
	}
	dst, err := name.ParseReference(target)
	if err != nil {
		return &InvalidNameError{Ref: target, Err: err}
	}
	img, err := s.Image(rec.ID)
	if err != nil {
		return err
	}
	host := dst.Context().RegistryStr()
	auth, err := s.registries.authFor(host, nil)
	if err != nil {
		return err
	}
	tr, err := s.registries.transport(host)
	if err != nil {
		return err
	}
	updates := make(chan v1.Update, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for u := range updates {
			if p != nil {
				p(u.Complete, u.Total)
			}
		}
	}()
	err = remote.Write(dst, img, remote.WithContext(ctx), remote.WithAuth(auth), remote.WithTransport(tr), remote.WithProgress(updates))
	<-done
	if err != nil {
		return fmt.Errorf("push %s to %s: %w", ref, dst, err)
	}
	return nil
}
