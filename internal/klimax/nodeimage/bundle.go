package nodeimage

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"strings"
)

// A bundle carries to an air-gapped machine what `klimax cluster create`
// needs and cannot build or download there: the node image and the
// registry-mirror image (one `docker save` stream) and the MetalLB manifest
// the build seeded. It is a tar of bundle.json, images.tar and
// manifests/metallb/<version>.yaml.
const (
	bundleMeta   = "bundle.json"
	bundleImages = "images.tar"
	bundleMetal  = "manifests/metallb/"
)

// Engine is the part of a Docker engine a bundle needs.
type Engine interface {
	SaveImages(ctx context.Context, refs []string, w io.Writer) error
	LoadImages(ctx context.Context, r io.Reader) ([]string, error)
}

// Bundle is what a bundle holds.
type Bundle struct {
	Images          []string `json:"images"`
	MetalLBVersion  string   `json:"metalLBVersion,omitempty"`
	MetalLBManifest []byte   `json:"-"`
}

var releaseTag = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)

// WriteBundle writes b to w, the images saved from e. The image stream is
// staged in a temporary file under tmpDir (a tar entry needs its size).
func WriteBundle(ctx context.Context, e Engine, w io.Writer, b Bundle, tmpDir string) error {
	if len(b.Images) == 0 {
		return errors.New("bundle: no images")
	}
	if b.MetalLBVersion != "" && !releaseTag.MatchString(b.MetalLBVersion) {
		return fmt.Errorf("bundle: MetalLB version %q is not a release tag like v0.16.1", b.MetalLBVersion)
	}
	f, err := os.CreateTemp(tmpDir, "klimax-bundle-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := e.SaveImages(ctx, b.Images, f); err != nil {
		return err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	meta, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	put := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	if err := put(bundleMeta, int64(len(meta)), strings.NewReader(string(meta))); err != nil {
		return err
	}
	if b.MetalLBVersion != "" && len(b.MetalLBManifest) > 0 {
		if err := put(bundleMetal+b.MetalLBVersion+".yaml", int64(len(b.MetalLBManifest)), strings.NewReader(string(b.MetalLBManifest))); err != nil {
			return err
		}
	}
	if err := put(bundleImages, size, f); err != nil {
		return err
	}
	return tw.Close()
}

// ReadBundle loads a bundle's images into e and returns what it held, the
// images as the engine reported them loaded.
func ReadBundle(ctx context.Context, e Engine, r io.Reader) (Bundle, error) {
	var b Bundle
	sawMeta, sawImages := false, false
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return b, fmt.Errorf("not a klimax bundle: %w", err)
		}
		switch name := path.Clean(h.Name); {
		case name == bundleMeta:
			if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&b); err != nil {
				return b, fmt.Errorf("bundle: %s: %w", bundleMeta, err)
			}
			sawMeta = true
		case strings.HasPrefix(name, bundleMetal) && strings.HasSuffix(name, ".yaml"):
			v := strings.TrimSuffix(strings.TrimPrefix(name, bundleMetal), ".yaml")
			if !releaseTag.MatchString(v) {
				return b, fmt.Errorf("bundle: %s: not a MetalLB release", name)
			}
			if b.MetalLBManifest, err = io.ReadAll(io.LimitReader(tr, 16<<20)); err != nil {
				return b, err
			}
			b.MetalLBVersion = v
		case name == bundleImages:
			loaded, err := e.LoadImages(ctx, tr)
			if err != nil {
				return b, err
			}
			b.Images = loaded
			sawImages = true
		}
	}
	if !sawMeta || !sawImages {
		return b, fmt.Errorf("not a klimax bundle (no %s or %s): make one with `klimax node-image save`", bundleMeta, bundleImages)
	}
	return b, nil
}
