package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

func blobCount(t *testing.T, s *Store) int {
	t.Helper()
	e, err := os.ReadDir(filepath.Join(s.root, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	return len(e)
}

// Add keeps one copy of each blob; untagging the last name deletes the
// image and only the blobs no other image uses.
func TestAddTagUntagSharesBlobs(t *testing.T) {
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	base, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	extra, _ := random.Layer(512, "application/vnd.oci.image.layer.v1.tar+gzip")
	child, err := mutate.AppendLayers(base, extra)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var got []int64
	a, err := s.Add(ctx, base, []string{"a:v1"}, func(done, total int64) { got = append(got, done, total) })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 2 || got[len(got)-2] != got[len(got)-1] || got[len(got)-1] == 0 {
		t.Fatalf("progress %v does not end at the total", got)
	}
	if _, err := s.Add(ctx, child, []string{"b:v1"}, nil); err != nil {
		t.Fatal(err)
	}
	// base: config + 2 layers; child: its own config + 1 more layer.
	if n := blobCount(t, s); n != 5 {
		t.Fatalf("%d blobs, want 5 (shared layers once)", n)
	}
	if _, err := s.Tag("a:v1", "c:v1"); err != nil {
		t.Fatal(err)
	}
	if deleted, err := s.Untag("a:v1", nil); err != nil || deleted {
		t.Fatalf("untag of one of two names: deleted %v, %v", deleted, err)
	}
	if img, ok := s.Lookup("c:v1"); !ok || img.ID != a.ID {
		t.Fatal("c:v1 lost")
	}
	refuse := func(id string) error { return os.ErrPermission }
	if _, err := s.Untag("c:v1", refuse); err == nil {
		t.Fatal("inUse refusal ignored")
	}
	if deleted, err := s.Untag("c:v1", nil); err != nil || !deleted {
		t.Fatalf("untag of the last name: deleted %v, %v", deleted, err)
	}
	if n := blobCount(t, s); n != 4 {
		t.Fatalf("%d blobs after deleting base, want 4 (the child's config and 3 layers)", n)
	}
	if _, err := s.Image(mustDigest(t, child)); err != nil {
		t.Fatalf("child unreadable after base was deleted: %v", err)
	}
}

func mustDigest(t *testing.T, img v1.Image) string {
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// Save writes a docker-archive that Load reads back into another store
// with the same config and layers; Prune keeps what keep says.
func TestSaveLoadPrune(t *testing.T) {
	ctx := context.Background()
	src, _ := NewStore(t.TempDir(), nil)
	img := hostImage(t)
	if _, err := src.Add(ctx, img, []string{"example.com/prog:v1"}, nil); err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "x.tar")
	f, _ := os.Create(tarPath)
	if err := src.Save(f, []string{"example.com/prog:v1"}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dst, _ := NewStore(t.TempDir(), nil)
	loaded, err := dst.Load(ctx, tarPath, []string{"other:v2"})
	if err != nil || len(loaded) != 1 {
		t.Fatalf("load: %v %v", loaded, err)
	}
	if !strings.Contains(strings.Join(loaded[0].RepoTags, ","), "example.com/prog:v1") || !strings.Contains(strings.Join(loaded[0].RepoTags, ","), "other:v2") {
		t.Fatalf("tags %v", loaded[0].RepoTags)
	}
	li, err := dst.Image(loaded[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.ConfigName()
	if got, _ := li.ConfigName(); got != want {
		t.Fatalf("config %s, want %s", got, want)
	}
	if _, err := os.Stat(filepath.Join(loaded[0].RootFS, "app", "prog")); err != nil {
		t.Fatalf("not unpacked: %v", err)
	}
	res, err := dst.Prune(func(*Image) bool { return true }, false)
	if err != nil || len(res.Removed) != 0 {
		t.Fatalf("prune kept nothing: %+v %v", res, err)
	}
	res, err = dst.Prune(func(*Image) bool { return false }, true)
	if err != nil || len(res.Removed) != 1 || res.Freed == 0 || len(dst.List()) != 1 {
		t.Fatalf("dry run: %+v %v", res, err)
	}
	if res, err = dst.Prune(func(*Image) bool { return false }, false); err != nil || len(res.Removed) != 1 || len(dst.List()) != 0 || blobCount(t, dst) != 0 {
		t.Fatalf("prune: %+v %v, %d blobs left", res, err, blobCount(t, dst))
	}
	if _, err := dst.Load(ctx, "/etc/hostname", nil); err == nil || !strings.Contains(err.Error(), "docker save") {
		t.Fatalf("not a tarball: %v", err)
	}
}
