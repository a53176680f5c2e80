package nodeimage

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

// fakeEngine keeps images as bytes and saves/loads them in the shape of
// `docker save` (a tar with manifest.json naming the RepoTags); like the
// engine, it refuses to save an image it lacks and to load a stream that is
// not an image archive.
type fakeEngine struct{ images map[string]string }

func (e *fakeEngine) SaveImages(_ context.Context, refs []string, w io.Writer) error {
	tw := tar.NewWriter(w)
	var manifest []map[string]any
	for i, ref := range refs {
		data, ok := e.images[ref]
		if !ok {
			return fmt.Errorf("no image %s in the Docker engine", ref)
		}
		name := fmt.Sprintf("layer%d", i)
		tw.WriteHeader(&tar.Header{Name: name, Size: int64(len(data)), Mode: 0o644})
		io.WriteString(tw, data)
		manifest = append(manifest, map[string]any{"RepoTags": []string{ref}, "Layers": []string{name}})
	}
	m, _ := json.Marshal(manifest)
	tw.WriteHeader(&tar.Header{Name: "manifest.json", Size: int64(len(m)), Mode: 0o644})
	tw.Write(m)
	return tw.Close()
}

func (e *fakeEngine) LoadImages(_ context.Context, r io.Reader) ([]string, error) {
	tr := tar.NewReader(r)
	layers := map[string]string{}
	var manifest []struct{ RepoTags, Layers []string }
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("docker load: %w", err)
		}
		b, _ := io.ReadAll(tr)
		if h.Name == "manifest.json" {
			if err := json.Unmarshal(b, &manifest); err != nil {
				return nil, err
			}
			continue
		}
		layers[h.Name] = string(b)
	}
	if manifest == nil {
		return nil, errors.New("docker load: no manifest.json: not an image archive")
	}
	var loaded []string
	for _, m := range manifest {
		layer, ok := layers[m.Layers[0]]
		if !ok {
			return nil, fmt.Errorf("docker load: layer %s of %s is missing", m.Layers[0], m.RepoTags[0])
		}
		e.images[m.RepoTags[0]] = layer
		loaded = append(loaded, m.RepoTags[0])
	}
	return loaded, nil
}

func TestBundleRoundTrip(t *testing.T) {
	src := &fakeEngine{images: map[string]string{"klimax/node:v1.37.2": "node", MirrorImage: "registry"}}
	b := Bundle{Images: []string{"klimax/node:v1.37.2", MirrorImage}, MetalLBVersion: "v0.16.1", MetalLBManifest: []byte("kind: Namespace\n")}
	var buf bytes.Buffer
	if err := WriteBundle(context.Background(), src, &buf, b, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	dst := &fakeEngine{images: map[string]string{}}
	got, err := ReadBundle(context.Background(), dst, bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got.Images, ",") != "klimax/node:v1.37.2,"+MirrorImage || got.MetalLBVersion != "v0.16.1" ||
		string(got.MetalLBManifest) != "kind: Namespace\n" || dst.images["klimax/node:v1.37.2"] != "node" || dst.images[MirrorImage] != "registry" {
		t.Fatalf("read %+v, engine %v", got, dst.images)
	}
}

func TestBundleRefuses(t *testing.T) {
	src := &fakeEngine{images: map[string]string{}}
	var buf bytes.Buffer
	err := WriteBundle(context.Background(), src, &buf, Bundle{Images: []string{"klimax/node:v9.9.9"}}, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "no image klimax/node:v9.9.9") {
		t.Errorf("missing image: %v", err)
	}
	// A tar that is not a bundle, and a truncated bundle.
	var other bytes.Buffer
	tw := tar.NewWriter(&other)
	tw.WriteHeader(&tar.Header{Name: "x", Size: 1, Mode: 0o644})
	tw.Write([]byte("x"))
	tw.Close()
	if _, err := ReadBundle(context.Background(), &fakeEngine{images: map[string]string{}}, &other); err == nil || !strings.Contains(err.Error(), "klimax node-image save") {
		t.Errorf("not a bundle: %v", err)
	}
	src.images["a:1"] = strings.Repeat("a", 4096)
	buf.Reset()
	if err := WriteBundle(context.Background(), src, &buf, Bundle{Images: []string{"a:1"}}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadBundle(context.Background(), &fakeEngine{images: map[string]string{}}, bytes.NewReader(buf.Bytes()[:buf.Len()/2])); err == nil {
		t.Error("a truncated bundle was accepted")
	}
}
