package image

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

var progBin string

func TestMain(m *testing.M) {
	dir, _ := os.MkdirTemp("", "k3sm-imgtest")
	var err error
	if progBin, err = imagetest.BuildProg(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func hostImage(t *testing.T) v1.Image {
	img, err := imagetest.Image(progBin, v1.Platform{})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestDefaultPullAlways(t *testing.T) {
	for ref, want := range map[string]bool{
		"nginx": true, "nginx:latest": true, "nginx:1.25": false, "127.0.0.1:5000/a/b": true,
		"127.0.0.1:5000/a/b:v1": false, "x@sha256:" + strings.Repeat("a", 64): false, "localhost:5000/x:latest": true,
	} {
		if got := DefaultPullAlways(ref); got != want {
			t.Errorf("DefaultPullAlways(%q) = %v, want %v", ref, got, want)
		}
	}
}

func TestIntegrationPullUnpackOnceAndLookup(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	reg := imagetest.StartRegistry(t, "", "")
	img := hostImage(t)
	ref := reg.Push(t, "prog:v1", img)
	ref2 := reg.Push(t, "prog:v2", img)
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got, err := s.Pull(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	dg, _ := img.Digest()
	if got.ID != dg.String() {
		t.Errorf("image id %s, want %s", got.ID, dg)
	}
	if len(got.RepoDigests) != 1 || got.RepoDigests[0] != reg.Host+"/prog@"+dg.String() {
		t.Errorf("repo digests %v", got.RepoDigests)
	}
	if fi, err := os.Stat(filepath.Join(got.RootFS, "app", "prog")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("unpacked binary: %v %v", fi, err)
	}
	if got.Config.Entrypoint[0] != "/app/prog" {
		t.Errorf("config %+v", got.Config)
	}
	before, _ := os.Stat(filepath.Join(got.RootFS, "app", "prog"))
	got2, err := s.Pull(ctx, ref2, nil)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(filepath.Join(got2.RootFS, "app", "prog"))
	if !os.SameFile(before, after) {
		t.Error("the same digest was unpacked twice")
	}
	if l := s.List(); len(l) != 1 || len(l[0].RepoTags) != 2 {
		t.Fatalf("list %+v", l)
	}
	// Reopening the store keeps what it knew.
	s2, err := NewStore(s.root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.Lookup(ref2); !ok {
		t.Error("lookup by tag after reopen failed")
	}
	if _, ok := s2.Lookup(reg.Host + "/prog@" + dg.String()); !ok {
		t.Error("lookup by digest failed")
	}
	if err := s2.Remove(ref); err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.Lookup(ref2); ok {
		t.Error("removed image still found")
	}
	if _, err := os.Stat(got.RootFS); !os.IsNotExist(err) {
		t.Error("removed image's tree is still on disk")
	}
}

func TestIntegrationPullErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	reg := imagetest.StartRegistry(t, "", "")
	foreign, err := imagetest.Image(progBin, imagetest.ForeignPlatform())
	if err != nil {
		t.Fatal(err)
	}
	s, _ := NewStore(t.TempDir(), nil)
	ctx := context.Background()

	ref := reg.Push(t, "foreign:v1", foreign)
	_, err = s.Pull(ctx, ref, nil)
	var pe *PlatformError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "not for this node's platform") {
		t.Errorf("foreign image: %v", err)
	}
	idx := reg.PushIndex(t, "foreignidx:v1", imagetest.PlatformImage{Platform: imagetest.ForeignPlatform(), Image: foreign})
	if _, err = s.Pull(ctx, idx, nil); !errors.As(err, &pe) {
		t.Errorf("foreign index: %v", err)
	}
	// An index with the host platform picks it.
	multi := reg.PushIndex(t, "multi:v1", imagetest.PlatformImage{Platform: imagetest.ForeignPlatform(), Image: foreign},
		imagetest.PlatformImage{Platform: v1.Platform{OS: pe.Want[:strings.Index(pe.Want, "/")], Architecture: pe.Want[strings.Index(pe.Want, "/")+1:]}, Image: hostImage(t)})
	got, err := s.Pull(ctx, multi, nil)
	if err != nil {
		t.Fatal(err)
	}
	if hd, _ := hostImage(t).Digest(); got.ID != hd.String() {
		t.Errorf("index pull chose %s, want the host image %s", got.ID, hd)
	}

	if _, err = s.Pull(ctx, reg.Host+"/missing:v1", nil); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing image: %v", err)
	}
	var ie *InvalidNameError
	if _, err = s.Pull(ctx, "UPPER/Case::bad", nil); !errors.As(err, &ie) {
		t.Errorf("invalid name: %v", err)
	}
}

func TestIntegrationPullSecretsAndMirrors(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	reg := imagetest.StartRegistry(t, "alice", "s3cret")
	ref := reg.Push(t, "private:v1", hostImage(t), remote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"}))
	s, _ := NewStore(t.TempDir(), nil)
	ctx := context.Background()
	if _, err := s.Pull(ctx, ref, nil); err == nil || !strings.Contains(err.Error(), "pull access denied") {
		t.Fatalf("pull without credentials: %v", err)
	}
	secret := fmt.Sprintf(`{"auths":{"%s":{"auth":"%s"}}}`, reg.Host, base64.StdEncoding.EncodeToString([]byte("alice:s3cret")))
	if _, err := s.Pull(ctx, ref, [][]byte{[]byte(`{"auths":{"other.example":{"username":"x","password":"y"}}}`), []byte(secret)}); err != nil {
		t.Fatalf("pull with a pull secret: %v", err)
	}

	// A registries file mirrors a registry name nobody resolves to the
	// local registry (plain HTTP), with its credentials.
	dir := t.TempDir()
	cfg := filepath.Join(dir, "registries.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`mirrors:
  "registry.k3sm.test":
    endpoint:
      - "http://%s"
configs:
  "%s":
    auth:
      username: alice
      password: s3cret
`, reg.Host, reg.Host)), 0o600)
	regs, err := LoadRegistries(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := NewStore(filepath.Join(dir, "images"), regs)
	got, err := s2.Pull(ctx, "registry.k3sm.test/private:v1", nil)
	if err != nil {
		t.Fatalf("pull through mirror: %v", err)
	}
	if got.RepoTags[0] != "registry.k3sm.test/private:v1" || !strings.HasPrefix(got.RepoDigests[0], "registry.k3sm.test/private@sha256:") {
		t.Errorf("recorded under %v %v, want the pod's name", got.RepoTags, got.RepoDigests)
	}
}

func TestLoadRegistriesErrors(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"mirrors:\n  docker.io:\n    endpoint: [\"ftp://x\"]\n": "mirrors.docker.io.endpoint[0]",
		"mirror:\n  x: 1\n": "unknown field",
		"configs:\n  h:\n    auth:\n      auth: \"!!!\"\n": "configs.h.auth.auth",
	} {
		p := filepath.Join(dir, "r.yaml")
		os.WriteFile(p, []byte(body), 0o600)
		if _, err := LoadRegistries(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want mention of %q", body, err, want)
		}
	}
	if r, err := LoadRegistries(filepath.Join(dir, "absent.yaml")); err != nil || r == nil {
		t.Errorf("a missing file is an empty config: %v", err)
	}
}
