package docker_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/moby/moby/client"

	"github.com/k3sm-dev/k3sm/internal/klimax/docker/dockertest"
)

// SaveImages, LoadImages and ImageTags against the real engine: what is
// saved and removed comes back under its name (the air-gapped bundle).
func TestIntegrationSaveLoadImages(t *testing.T) {
	c := dockertest.Engine(t)
	ctx := context.Background()
	repo := "klimax-test-bundle-" + dockertest.UniqueName("sl")
	ref := repo + ":v1.0.0"
	dockertest.RegistryImage(t, c, ref)
	t.Cleanup(func() { c.API().ImageRemove(ctx, ref, client.ImageRemoveOptions{Force: true}) })
	if tags, err := c.ImageTags(ctx, repo); err != nil || !slices.Equal(tags, []string{ref}) {
		t.Fatalf("tags %v %v", tags, err)
	}
	var buf bytes.Buffer
	if err := c.SaveImages(ctx, []string{ref}, &buf); err != nil {
		t.Fatal(err)
	}
	if err := c.SaveImages(ctx, []string{ref + "-missing"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "no image") {
		t.Errorf("saving a missing image: %v", err)
	}
	if _, err := c.API().ImageRemove(ctx, ref, client.ImageRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.ImageExists(ctx, ref); ok {
		t.Fatal("image still there after remove")
	}
	loaded, err := c.LoadImages(ctx, bytes.NewReader(buf.Bytes()))
	if err != nil || !slices.Equal(loaded, []string{ref}) {
		t.Fatalf("loaded %v %v", loaded, err)
	}
	if ok, err := c.ImageExists(ctx, ref); !ok || err != nil {
		t.Fatalf("after load: %v %v", ok, err)
	}
	if _, err := c.LoadImages(ctx, strings.NewReader("not a tar")); err == nil {
		t.Error("loading garbage succeeded")
	}
}
