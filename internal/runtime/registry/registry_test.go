package registry

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/k3sm-dev/k3sm/internal/runtime/image"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

// node is one runtime daemon's registry: a store and the registry on it,
// served on 127.0.0.1:PORT. restart makes a new registry on the same store
// and journal and port, as a new daemon does.
type node struct {
	t     *testing.T
	root  string
	store *image.Store
	srv   *httptest.Server
	host  string
}

func newNode(t *testing.T) *node {
	n := &node{t: t, root: t.TempDir()}
	n.open(0)
	return n
}

func (n *node) open(port int) {
	t := n.t
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	port = ln.Addr().(*net.TCPAddr).Port
	store, err := image.NewStore(n.root, nil)
	if err != nil {
		t.Fatal(err)
	}
	store.SetPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})
	g, err := New(store, filepath.Join(n.root, "registry"), port, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	g.replay()
	n.store = store
	n.srv = httptest.NewUnstartedServer(g)
	n.srv.Listener.Close()
	n.srv.Listener = ln
	n.srv.Start()
	t.Cleanup(n.srv.Close)
	n.host = ln.Addr().String()
}

// restart serves a new registry on the old port.
func (n *node) restart() {
	port := n.srv.Listener.Addr().(*net.TCPAddr).Port
	n.srv.Close()
	n.open(port)
}

// get is a manifest request to the server.
func (n *node) get(path string) int {
	resp, err := http.Get(n.srv.URL + path)
	if err != nil {
		n.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (n *node) ref(s string) name.Reference {
	r, err := name.ParseReference(strings.Replace(s, "HOST", strings.TrimPrefix(n.srv.URL, "http://"), 1))
	if err != nil {
		n.t.Fatal(err)
	}
	return r
}

// relay forwards connections on another loopback port to the registry, as
// a forwarded port or a VM's relay does: clients push to 127.0.0.1:<relay
// port>, a host name that is not the registry's.
func (n *node) relay() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { ln.Close() })
	imagetest.ForwardTCP(ln, n.host)
	return ln.Addr().String()
}

func platformImage(t *testing.T, arch string) v1.Image {
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// A push stores the blobs in the image store once and records the image
// under 127.0.0.1:PORT; replay gives a new registry the manifest.
func TestPushLandsInStore(t *testing.T) {
	n := newNode(t)
	img, _ := random.Image(2048, 3)
	ref := n.ref("HOST/team/app:v1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil { // again: nothing new
		t.Fatal(err)
	}
	rec, ok := n.store.Lookup(n.host + "/team/app:v1")
	if !ok {
		t.Fatalf("pushed image not in the store: %v", n.store.List())
	}
	if d, _ := img.Digest(); rec.ID != d.String() {
		t.Fatalf("stored %s, pushed %s", rec.ID, d)
	}
	blobs, _ := os.ReadDir(filepath.Join(n.root, "blobs", "sha256"))
	if len(blobs) != 4 {
		t.Fatalf("%d blobs, want 4 (config and 3 layers once)", len(blobs))
	}
	// The store holds it: nothing in the journal.
	if refs, _ := os.ReadFile(filepath.Join(n.root, "registry", refsFile)); strings.Contains(string(refs), "team/app") {
		t.Fatalf("a stored image journaled too: %s", refs)
	}
	n.restart()
	if code := n.get("/v2/team/app/manifests/v1"); code != 200 {
		t.Fatalf("manifest after replay: %d", code)
	}
}

// A push through another host name (a forwarded port, a relay from a VM's
// Docker engine) is stored under the registry's own 127.0.0.1:PORT name,
// so pods naming that find it, and a restart serves it again.
func TestPushUnderAnotherHostIsStoredUnderTheRegistrysName(t *testing.T) {
	n := newNode(t)
	relay := n.relay()
	img := platformImage(t, "amd64")
	ref, err := name.ParseReference(relay + "/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range n.store.List() {
		names = append(names, i.RepoTags...)
	}
	if want := n.host + "/team/app:v1"; len(names) != 1 || names[0] != want {
		t.Fatalf("pushed through %s: stored as %v, want [%s]", relay, names, want)
	}
	n.restart()
	got, err := remote.Image(n.ref("HOST/team/app:v1"))
	if err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if err := validate.Image(got); err != nil {
		t.Fatalf("after a restart it does not verify: %v", err)
	}
	if must(got.Digest()) != must(img.Digest()) {
		t.Fatalf("after a restart %s, pushed %s", must(got.Digest()), must(img.Digest()))
	}
}

// A multi-platform index, a push by digest only, and an image of another
// platform (which the store refuses) are served again after a restart,
// whole: every manifest and blob reads back and verifies.
func TestIndexAndDigestPushesSurviveRestart(t *testing.T) {
	n := newNode(t)
	amd, arm := platformImage(t, "amd64"), platformImage(t, "arm64")
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	), types.OCIImageIndex)
	if err := remote.WriteIndex(n.ref("HOST/multi/app:v1"), idx); err != nil {
		t.Fatal(err)
	}
	byDigest := platformImage(t, "amd64")
	d, _ := byDigest.Digest()
	if err := remote.Write(n.ref("HOST/pinned/app@"+d.String()), byDigest); err != nil {
		t.Fatal(err)
	}
	foreign := platformImage(t, "s390x")
	if err := remote.Write(n.ref("HOST/foreign/app:v2"), foreign); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.store.Lookup(n.host + "/foreign/app:v2"); ok {
		t.Fatal("the store took an s390x image on an amd64 node")
	}

	n.restart()
	live := strings.TrimPrefix(n.srv.URL, "http://")
	got, err := remote.Index(n.ref("HOST/multi/app:v1"))
	if err != nil {
		t.Fatalf("the index after a restart: %v", err)
	}
	if err := validate.Index(got); err != nil {
		t.Fatalf("the index after a restart does not verify: %v", err)
	}
	if gd, _ := got.Digest(); gd != must(idx.Digest()) {
		t.Fatalf("index digest %s, pushed %s", gd, must(idx.Digest()))
	}
	for _, r := range []string{"HOST/pinned/app@" + d.String(), "HOST/foreign/app:v2", "HOST/multi/app@" + must(arm.Digest()).String()} {
		img, err := remote.Image(n.ref(r))
		if err != nil {
			t.Fatalf("%s after a restart: %v", strings.Replace(r, "HOST", live, 1), err)
		}
		if err := validate.Image(img); err != nil {
			t.Fatalf("%s after a restart does not verify: %v", r, err)
		}
	}

	// A delete lasts across a restart too.
	if err := remote.Delete(n.ref("HOST/foreign/app:v2")); err != nil {
		t.Fatal(err)
	}
	n.restart()
	if code := n.get("/v2/foreign/app/manifests/v2"); code != http.StatusNotFound {
		t.Fatalf("a deleted tag after a restart: %d", code)
	}
	if code := n.get("/v2/multi/app/manifests/v1"); code != 200 {
		t.Fatalf("the index after a second restart: %d", code)
	}
}

// Prune keeps the blobs of journaled manifests (they are no image of the
// store) until the registry forgets the manifests.
func TestJournaledBlobsArePinned(t *testing.T) {
	n := newNode(t)
	img := platformImage(t, "s390x")
	if err := remote.Write(n.ref("HOST/foreign/app:v1"), img); err != nil {
		t.Fatal(err)
	}
	stray, _ := random.Image(512, 1) // blobs no manifest names
	if err := remote.WriteLayer(n.ref("HOST/stray/x:v1").Context(), must2(stray.Layers())[0]); err != nil {
		t.Fatal(err)
	}
	age := func() { // prune takes strays older than an hour
		old := time.Now().Add(-2 * time.Hour)
		files, _ := filepath.Glob(filepath.Join(n.root, "blobs", "sha256", "*"))
		for _, f := range files {
			os.Chtimes(f, old, old)
		}
	}
	count := func() int {
		files, _ := filepath.Glob(filepath.Join(n.root, "blobs", "sha256", "*"))
		return len(files)
	}
	age()
	if _, err := n.store.Prune(func(*image.Image) bool { return false }, false); err != nil {
		t.Fatal(err)
	}
	if c := count(); c != 3 {
		t.Fatalf("%d blobs after prune, want the journaled image's 3 (config, 2 layers); the stray goes", c)
	}
	// Pins come back with the journal after a restart.
	n.restart()
	age()
	n.store.Prune(func(*image.Image) bool { return false }, false)
	if c := count(); c != 3 {
		t.Fatalf("%d blobs after a restart and prune, want 3", c)
	}
	if err := remote.Delete(n.ref("HOST/foreign/app:v1")); err != nil {
		t.Fatal(err)
	}
	if err := remote.Delete(n.ref("HOST/foreign/app@" + must(img.Digest()).String())); err != nil {
		t.Fatal(err)
	}
	n.store.Prune(func(*image.Image) bool { return false }, false)
	if c := count(); c != 0 {
		t.Fatalf("%d blobs once the registry forgot the manifest, want 0", c)
	}
	if files, _ := os.ReadDir(filepath.Join(n.root, "registry", "manifests", "sha256")); len(files) != 0 {
		t.Fatalf("journal manifests left: %v", files)
	}
}

// A tag pushed as an index, then as an image of this node: the later push
// wins after a restart, in the store and in the registry.
func TestLaterPushOfATagWins(t *testing.T) {
	n := newNode(t)
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: platformImage(t, "arm64")})
	if err := remote.WriteIndex(n.ref("HOST/app:v1"), idx); err != nil {
		t.Fatal(err)
	}
	img := platformImage(t, "amd64")
	if err := remote.Write(n.ref("HOST/app:v1"), img); err != nil {
		t.Fatal(err)
	}
	n.restart()
	desc, err := remote.Get(n.ref("HOST/app:v1"))
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != must(img.Digest()) {
		t.Fatalf("after a restart app:v1 is %s (%s), want the image pushed last %s", desc.Digest, desc.MediaType, must(img.Digest()))
	}
}

func must(h v1.Hash, err error) v1.Hash {
	if err != nil {
		panic(err)
	}
	return h
}

func must2[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
