package registry

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/k3sm-dev/k3sm/internal/runtime/image"
)

// A push stores the blobs in the image store once and records the image
// under the host the client used; replay gives a new registry the manifest.
func TestPushLandsInStore(t *testing.T) {
	dir := t.TempDir()
	store, err := image.NewStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(store, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img, _ := random.Image(2048, 3)
	ref, _ := name.ParseReference(host + "/team/app:v1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil { // again: nothing new
		t.Fatal(err)
	}
	rec, ok := store.Lookup(host + "/team/app:v1")
	if !ok {
		t.Fatalf("pushed image not in the store: %v", store.List())
	}
	if d, _ := img.Digest(); rec.ID != d.String() {
		t.Fatalf("stored %s, pushed %s", rec.ID, d)
	}
	blobs, _ := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if len(blobs) != 4 {
		t.Fatalf("%d blobs, want 4 (config and 3 layers once)", len(blobs))
	}
	// A fresh registry (a restart) on the same store, given the manifests back.
	h := Handler(store, slog.New(slog.DiscardHandler))
	replay(h, store, srv.Listener.Addr().(*net.TCPAddr).Port)
	srv2 := httptest.NewServer(h)
	defer srv2.Close()
	resp, err := http.Get(srv2.URL + "/v2/team/app/manifests/v1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("manifest after replay: %s", resp.Status)
	}
}
