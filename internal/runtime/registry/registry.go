// Package registry is the node-local OCI registry: go-containerregistry's
// pkg/registry with its blobs in the runtime's image store, so an image
// pushed to it is stored once and pods that name it (127.0.0.1:PORT/... or
// localhost:PORT/...) run it without another copy. It runs in the runtime
// daemon, the store's one writer, and listens on loopback only. pkg/registry
// keeps manifests in memory: at start they come back from the store's
// images and from the registry's journal.
package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/k3sm-dev/k3sm/internal/runtime/image"
)

// blobs serves and stores blobs in the image store.
type blobs struct{ store *image.Store }

func (b blobs) Get(_ context.Context, _ string, h v1.Hash) (io.ReadCloser, error) {
	f, err := b.store.OpenBlob(h)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ggcr.ErrNotFound
	}
	return f, err
}

func (b blobs) Stat(_ context.Context, _ string, h v1.Hash) (int64, error) {
	n, ok := b.store.HasBlob(h)
	if !ok {
		return 0, ggcr.ErrNotFound
	}
	return n, nil
}

func (b blobs) Put(_ context.Context, _ string, h v1.Hash, rc io.ReadCloser) error {
	defer rc.Close()
	return b.store.PutBlob(h, rc)
}

// Registry is the node-local registry. A manifest pushed under a tag that
// is an image for this node is recorded in the store under
// 127.0.0.1:PORT/<repo>:<tag>, whatever host name the client pushed to (a
// forwarded port, localhost:PORT, a relay from a VM's Docker engine), and
// unpacked, so `k3sm image ls` shows it and a pod
// with pullPolicy IfNotPresent runs it at once; every other manifest
// (indexes, pushes by digest, other platforms, artifacts) goes to a journal
// on disk, its blobs pinned in the store, so a restart serves it again.
type Registry struct {
	// host is 127.0.0.1:PORT, the name pods use for the registry.
	host    string
	store   *image.Store
	inner   http.Handler
	journal *journal
	log     *slog.Logger
}

// New opens the registry on store, its journal in dir; port is the one it
// serves on 127.0.0.1.
func New(store *image.Store, dir string, port int, logger *slog.Logger) (*Registry, error) {
	j, err := openJournal(dir)
	if err != nil {
		return nil, err
	}
	store.PinBlobs(j.pins)
	return &Registry{host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), store: store, journal: j, log: logger,
		inner: ggcr.New(ggcr.WithBlobHandler(blobs{store}), ggcr.Logger(log.New(io.Discard, "", 0)))}, nil
}

func (g *Registry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	repo, reference, ok := manifestPath(r.URL.Path)
	if !ok || (r.Method != http.MethodPut && r.Method != http.MethodDelete) {
		g.inner.ServeHTTP(w, r)
		return
	}
	var body []byte
	if r.Method == http.MethodPut {
		var err error
		if body, err = io.ReadAll(io.LimitReader(r.Body, 4<<20)); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	// The answer waits until the journal has the change: a client told
	// "created" finds its manifest after a restart.
	rec := httptest.NewRecorder()
	g.inner.ServeHTTP(rec, r)
	if rec.Code/100 == 2 {
		if err := g.record(r, repo, reference, body, rec.Header().Get("Docker-Content-Digest")); err != nil {
			g.log.Warn("registry: cannot journal a manifest; it is served until the server stops", "repo", repo, "ref", reference, "err", err)
			http.Error(w, "registry journal: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// record keeps a manifest change: a tagged image of this node goes to the
// store, everything else to the journal.
func (g *Registry) record(r *http.Request, repo, reference string, body []byte, digest string) error {
	if r.Method == http.MethodDelete {
		return g.journal.drop(repo, reference)
	}
	if !strings.HasPrefix(reference, "sha256:") && g.storeImage(r, repo, reference, body) {
		// The store holds this tag now; an older journaled push under it goes.
		return g.journal.drop(repo, reference)
	}
	mt := r.Header.Get("Content-Type")
	if mt == "" {
		mt = mediaType(body)
	}
	return g.journal.put(repo, reference, digest, mt, body)
}

// storeImage records a tagged push as an image of the store if it is one
// for this node. The name is the registry's own, not the request's Host: a
// push through another name would be stored where neither a pod naming
// 127.0.0.1:PORT nor replay after a restart finds it.
func (g *Registry) storeImage(r *http.Request, repo, tag string, body []byte) bool {
	img, err := g.store.FromManifest(body)
	if err != nil {
		g.log.Debug("registry: manifest not stored as an image", "repo", repo, "ref", tag, "err", err)
		return false
	}
	name := g.host + "/" + repo + ":" + tag
	if _, err := g.store.Add(r.Context(), img, []string{name}, nil); err != nil {
		g.log.Info("registry: pushed manifest kept by the registry, not as an image of the store", "image", name, "err", err)
		return false
	}
	return true
}

// manifestPath splits /v2/<repo>/manifests/<ref>.
func manifestPath(p string) (repo, ref string, ok bool) {
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndex(rest, "/manifests/")
	if i <= 0 {
		return "", "", false
	}
	return rest[:i], rest[i+len("/manifests/"):], true
}

// replay gives a new registry the manifests it served before a restart:
// the stored images named under its host (or localhost:PORT, as earlier
// versions stored some pushes), then the journal (which wins: it holds the
// newer push of a tag).
func (g *Registry) replay() {
	_, port, _ := net.SplitHostPort(g.host)
	hosts := []string{g.host, "localhost:" + port}
	put := func(host, repo, reference, mt string, raw []byte) int {
		req := httptest.NewRequest(http.MethodPut, "/v2/"+repo+"/manifests/"+reference, bytes.NewReader(raw))
		req.Host = host
		req.Header.Set("Content-Type", mt)
		rec := httptest.NewRecorder()
		g.inner.ServeHTTP(rec, req)
		return rec.Code
	}
	for _, img := range g.store.List() {
		raw, _, err := g.store.ManifestOf(img.ID)
		if err != nil {
			continue
		}
		for _, t := range img.RepoTags {
			tag, err := name.NewTag(t)
			if err != nil {
				continue
			}
			host := tag.RegistryStr()
			if host != hosts[0] && host != hosts[1] {
				continue
			}
			put(host, tag.RepositoryStr(), tag.TagStr(), mediaType(raw), raw)
		}
	}
	// Passes until nothing more goes in: an index waits for its manifests.
	pending := g.journal.entries()
	for len(pending) > 0 {
		var again []entry
		for _, e := range pending {
			if !g.blobsThere(e) {
				g.log.Warn("registry: a journaled manifest's blobs are gone from the store; not served", "repo", e.repo, "ref", e.reference)
				continue
			}
			if code := put(hosts[0], e.repo, e.reference, e.MediaType, e.raw); code/100 != 2 {
				again = append(again, e)
			}
		}
		if len(again) == len(pending) {
			for _, e := range again {
				g.log.Warn("registry: a journaled manifest was refused (an index whose manifests are gone?); not served", "repo", e.repo, "ref", e.reference)
			}
			break
		}
		pending = again
	}
}

// blobsThere: an image manifest's config and layers are in the store.
func (g *Registry) blobsThere(e entry) bool {
	if !types.MediaType(e.MediaType).IsImage() {
		return true
	}
	m, err := v1.ParseManifest(bytes.NewReader(e.raw))
	if err != nil {
		return false
	}
	for _, d := range append([]v1.Descriptor{m.Config}, m.Layers...) {
		if _, ok := g.store.HasBlob(d.Digest); !ok {
			return false
		}
	}
	return true
}

// mediaType is what a manifest says it is; OCI image manifest if unsaid.
func mediaType(raw []byte) string {
	var m struct {
		MediaType types.MediaType `json:"mediaType"`
	}
	if json.Unmarshal(raw, &m) != nil || m.MediaType == "" {
		return string(types.OCIManifestSchema1)
	}
	return string(m.MediaType)
}

// Serve listens on 127.0.0.1:port until ctx ends; dir holds its journal.
func Serve(ctx context.Context, store *image.Store, dir string, port int, logger *slog.Logger) error {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("--registry-port %d: %w (choose a free port)", port, err)
	}
	g, err := New(store, dir, port, logger)
	if err != nil {
		ln.Close()
		return err
	}
	g.replay()
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	logger.Info("node-local registry serving", "address", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
