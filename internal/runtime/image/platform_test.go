package image

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

func TestRunsOn(t *testing.T) {
	p := v1.Platform{OS: "linux", Architecture: "amd64"}
	for _, tc := range []struct {
		os, arch string
		want     bool
	}{
		{"", "", true}, {"linux", "", true}, {"", "amd64", true}, {"linux", "amd64", true},
		{"linux", "arm64", false}, {"windows", "", false}, {"", "arm64", false}, {"darwin", "amd64", false},
	} {
		if got := runsOn(tc.os, tc.arch, p); got != tc.want {
			t.Errorf("runsOn(%q, %q) = %v, want %v", tc.os, tc.arch, got, tc.want)
		}
	}
}

// appended is what `crane append` makes without a base: empty.Image plus a
// layer, whose config names no os or architecture.
func appended(t *testing.T, mut func(*v1.ConfigFile)) v1.Image {
	t.Helper()
	layer, err := random.Layer(512, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	if mut == nil {
		return img
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	mut(cf)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// pushIndex pushes an index as it is (imagetest's PushIndex gives every
// entry a platform).
func pushIndex(t *testing.T, reg *imagetest.Registry, ref string, idx v1.ImageIndex) string {
	t.Helper()
	full := reg.Host + "/" + ref
	tag, err := name.ParseReference(full)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	return full
}

func host() v1.Platform { return v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH} }

func TestIntegrationPullPlatforms(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	reg := imagetest.StartRegistry(t, "", "")
	foreign := imagetest.ForeignPlatform()
	want := host().OS + "/" + host().Architecture
	foreignName := foreign.OS + "/" + foreign.Architecture
	bare := appended(t, nil)
	if cf, _ := bare.ConfigFile(); cf.OS != "" || cf.Architecture != "" {
		t.Fatalf("test image names a platform: %s/%s", cf.OS, cf.Architecture)
	}
	osOnly := appended(t, func(cf *v1.ConfigFile) { cf.OS = runtime.GOOS })
	otherArch := appended(t, func(cf *v1.ConfigFile) { cf.OS, cf.Architecture = foreign.OS, foreign.Architecture })
	otherOS := appended(t, func(cf *v1.ConfigFile) { cf.OS = "windows" })

	attestation := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: bare, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "unknown", Architecture: "unknown"}}})
	undeclared := func(img v1.Image) v1.ImageIndex {
		return mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{Add: img})
	}

	for _, tc := range []struct {
		name  string
		push  func() string
		image v1.Image // the image chosen; nil: refused
		// offered are the platforms a refusal names besides the one wanted.
		offered []string
	}{
		{"config without os and architecture", func() string { return reg.Push(t, "bare:v1", bare) }, bare, nil},
		{"config with os only", func() string { return reg.Push(t, "osonly:v1", osOnly) }, osOnly, nil},
		{"config naming another architecture", func() string { return reg.Push(t, "otherarch:v1", otherArch) }, nil, []string{foreignName}},
		{"config naming another os", func() string { return reg.Push(t, "otheros:v1", otherOS) }, nil, []string{"windows/?"}},
		{"index entry for the host, config without platform", func() string {
			return reg.PushIndex(t, "hostidx:v1", imagetest.PlatformImage{Platform: foreign, Image: otherArch},
				imagetest.PlatformImage{Platform: host(), Image: bare})
		}, bare, nil},
		{"index entry for the host, config naming another platform", func() string {
			return reg.PushIndex(t, "liaridx:v1", imagetest.PlatformImage{Platform: host(), Image: otherArch})
		}, nil, []string{foreignName}},
		{"index without the host platform", func() string {
			return reg.PushIndex(t, "foreignidx:v1", imagetest.PlatformImage{Platform: foreign, Image: otherArch},
				imagetest.PlatformImage{Platform: v1.Platform{OS: "windows", Architecture: "amd64"}, Image: otherOS})
		}, nil, []string{foreignName, "windows/amd64"}},
		{"index of attestations only", func() string { return pushIndex(t, reg, "attidx:v1", attestation) }, nil, nil},
		{"index entry without platform, config without platform", func() string {
			return pushIndex(t, reg, "undeclared:v1", undeclared(bare))
		}, bare, nil},
		{"index entry without platform, config naming another", func() string {
			return pushIndex(t, reg, "undeclaredforeign:v1", undeclared(otherArch))
		}, nil, []string{foreignName}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewStore(t.TempDir(), nil)
			if err != nil {
				t.Fatal(err)
			}
			ref := tc.push()
			got, err := s.Pull(context.Background(), ref, nil)
			if tc.image != nil {
				if err != nil {
					t.Fatal(err)
				}
				if dg, _ := tc.image.Digest(); got.ID != dg.String() {
					t.Fatalf("pulled %s, want %s", got.ID, dg)
				}
				return
			}
			var pe *PlatformError
			if !errors.As(err, &pe) {
				t.Fatalf("want a PlatformError, got %v", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "this node's platform "+want) || !strings.Contains(msg, ref) {
				t.Errorf("%q does not name the platform wanted (%s) and the image", msg, want)
			}
			for _, o := range tc.offered {
				if !strings.Contains(msg, o) {
					t.Errorf("%q does not name the platform offered %s", msg, o)
				}
			}
			if len(tc.offered) == 0 && !strings.Contains(msg, "offers no image for any platform") {
				t.Errorf("%q does not say that nothing is offered", msg)
			}
		})
	}
}
