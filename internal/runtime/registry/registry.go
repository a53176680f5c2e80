// Package registry is the node-local OCI registry: go-containerregistry's
// pkg/registry with its blobs in the runtime's image store, so an image
// pushed to it is stored once and pods that name it (127.0.0.1:PORT/... or
// localhost:PORT/...) run it without another copy. It runs in the runtime
// daemon, the store's one writer, and listens on loopback only.
package registry

import (
	"bytes"
	"context"
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

// Handler is the registry. A manifest pushed under a tag records the image
// in the store under <host the client used>/<repo>:<tag> and unpacks it,
// so `k3sm image ls` shows it and a pod with pullPolicy IfNotPresent runs
// it at once.
func Handler(store *image.Store, logger *slog.Logger) http.Handler {
	inner := ggcr.New(ggcr.WithBlobHandler(blobs{store}), ggcr.Logger(log.New(io.Discard, "", 0)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repo, ref, ok := manifestPath(r.URL.Path)
		if r.Method != http.MethodPut || !ok {
			inner.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := &statusWriter{ResponseWriter: w}
		inner.ServeHTTP(rec, r)
		if rec.code/100 != 2 || strings.HasPrefix(ref, "sha256:") {
			return
		}
		img, err := store.FromManifest(body)
		if err != nil {
			logger.Debug("registry: manifest not stored as an image", "repo", repo, "ref", ref, "err", err)
			return
		}
		tag := r.Host + "/" + repo + ":" + ref
		if _, err := store.Add(r.Context(), img, []string{tag}, nil); err != nil {
			logger.Warn("registry: store pushed image", "image", tag, "err", err)
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
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

// replay gives the registry back, after a restart, the manifests of the
// images stored under its names (pkg/registry keeps manifests in memory).
func replay(h http.Handler, store *image.Store, port int) {
	hosts := []string{"127.0.0.1:" + strconv.Itoa(port), "localhost:" + strconv.Itoa(port)}
	for _, img := range store.List() {
		raw, _, err := store.ManifestOf(img.ID)
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
			req := httptest.NewRequest(http.MethodPut, "/v2/"+tag.RepositoryStr()+"/manifests/"+tag.TagStr(), bytes.NewReader(raw))
			req.Host = host
			req.Header.Set("Content-Type", mediaType(raw))
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
	}
}

func mediaType(raw []byte) string {
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil || m.MediaType == "" {
		return "application/vnd.oci.image.manifest.v1+json"
	}
	return string(m.MediaType)
}

// Serve listens on 127.0.0.1:port until ctx ends.
func Serve(ctx context.Context, store *image.Store, port int, logger *slog.Logger) error {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("--registry-port %d: %w (choose a free port)", port, err)
	}
	h := Handler(store, logger)
	replay(h, store, port)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
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
