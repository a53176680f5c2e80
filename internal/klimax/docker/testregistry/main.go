// Command testregistry is the registry image klimax's Docker integration
// tests build and run (no image can be pulled here). It honours the subset
// of the registry:3 (CNCF distribution) environment contract that klimax's
// mirror containers use, so the same container wiring is exercised:
//
//	REGISTRY_HTTP_ADDR                         listen address (default :5000)
//	REGISTRY_PROXY_REMOTEURL                   upstream; set = pull-through proxy
//	REGISTRY_PROXY_USERNAME/PASSWORD           optional upstream credentials
//	REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY  cache root (default /var/lib/registry)
//
// Without REGISTRY_PROXY_REMOTEURL it is a plain in-memory registry (the
// tests' upstream). In proxy mode it is read only: manifests and blobs are
// fetched from upstream on first use, verified against their digest and
// kept on disk; a cached manifest is served when upstream is unreachable.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

func main() {
	addr := envOr("REGISTRY_HTTP_ADDR", ":5000")
	var h http.Handler
	if remoteURL := os.Getenv("REGISTRY_PROXY_REMOTEURL"); remoteURL != "" {
		p, err := newProxy(remoteURL, os.Getenv("REGISTRY_PROXY_USERNAME"), os.Getenv("REGISTRY_PROXY_PASSWORD"),
			envOr("REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY", "/var/lib/registry"))
		if err != nil {
			log.Fatal(err)
		}
		h = p
		log.Printf("pull-through proxy for %s on %s", remoteURL, addr)
	} else {
		h = registry.New()
		log.Printf("plain registry on %s", addr)
	}
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

type proxy struct {
	reg  name.Registry
	opts []remote.Option
	root string
}

func newProxy(remoteURL, user, pass, root string) (*proxy, error) {
	u, err := url.Parse(remoteURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("REGISTRY_PROXY_REMOTEURL %q is not a URL", remoteURL)
	}
	var nopts []name.Option
	if u.Scheme == "http" {
		nopts = append(nopts, name.Insecure)
	}
	reg, err := name.NewRegistry(u.Host, nopts...)
	if err != nil {
		return nil, err
	}
	auth := authn.Anonymous
	if user != "" {
		auth = &authn.Basic{Username: user, Password: pass}
	}
	for _, d := range []string{"blobs", "tags", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, err
		}
	}
	return &proxy{reg: reg, opts: []remote.Option{remote.WithAuth(auth)}, root: root}, nil
}

var (
	manifestRe = regexp.MustCompile(`^/v2/(.+)/manifests/([^/]+)$`)
	blobRe     = regexp.MustCompile(`^/v2/(.+)/blobs/(sha256:[a-f0-9]{64})$`)
	repoRe     = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$`)
	tagRe      = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, `{"errors":[{"code":"UNSUPPORTED","message":"read-only pull-through cache"}]}`, http.StatusMethodNotAllowed)
		return
	}
	if r.URL.Path == "/v2/" || r.URL.Path == "/v2" {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "{}")
		return
	}
	if m := manifestRe.FindStringSubmatch(r.URL.Path); m != nil && repoRe.MatchString(m[1]) {
		p.manifest(w, r, m[1], m[2])
		return
	}
	if m := blobRe.FindStringSubmatch(r.URL.Path); m != nil && repoRe.MatchString(m[1]) {
		p.blob(w, r, m[1], m[2])
		return
	}
	http.Error(w, `{"errors":[{"code":"NAME_UNKNOWN"}]}`, http.StatusNotFound)
}

type tagLink struct {
	Digest    string `json:"digest"`
	MediaType string `json:"mediaType"`
}

func (p *proxy) blobPath(digest string) string {
	return filepath.Join(p.root, "blobs", strings.TrimPrefix(digest, "sha256:"))
}

func (p *proxy) linkPath(repo, ref string) string {
	return filepath.Join(p.root, "tags", strings.ReplaceAll(repo, "/", "_"), ref+".json")
}

func (p *proxy) manifest(w http.ResponseWriter, r *http.Request, repo, ref string) {
	isDigest := strings.HasPrefix(ref, "sha256:")
	if !isDigest && !tagRe.MatchString(ref) {
		http.Error(w, "bad reference", http.StatusBadRequest)
		return
	}
	if isDigest {
		if link, ok := p.readLink(repo, ref); ok {
			p.serveFile(w, r, link.Digest, link.MediaType)
			return
		}
	}
	var upRef name.Reference
	var err error
	if isDigest {
		upRef, err = name.NewDigest(p.reg.RegistryStr()+"/"+repo+"@"+ref, name.Insecure)
	} else {
		upRef, err = name.NewTag(p.reg.RegistryStr()+"/"+repo+":"+ref, name.Insecure)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	upRef = retarget(upRef, p.reg)
	desc, err := remote.Get(upRef, append(p.opts, remote.WithContext(r.Context()))...)
	if err != nil {
		// Upstream unreachable or missing: fall back to the cached copy.
		if link, ok := p.readLink(repo, ref); ok {
			log.Printf("upstream failed for %s:%s (%v); serving cache", repo, ref, err)
			p.serveFile(w, r, link.Digest, link.MediaType)
			return
		}
		http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":`+jsonString(err.Error())+`}]}`, http.StatusNotFound)
		return
	}
	if err := p.store(desc.Digest, desc.Manifest); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	link := tagLink{Digest: desc.Digest.String(), MediaType: string(desc.MediaType)}
	for _, k := range []string{ref, desc.Digest.String()} {
		if err := p.writeLink(repo, k, link); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	p.serveFile(w, r, link.Digest, link.MediaType)
}

// retarget keeps the scheme decision (http for insecure) of p.reg.
func retarget(ref name.Reference, reg name.Registry) name.Reference {
	switch r := ref.(type) {
	case name.Tag:
		r.Repository.Registry = reg
		return r
	case name.Digest:
		d, _ := name.NewDigest(r.String(), name.Insecure)
		d.Repository.Registry = reg
		return d
	}
	return ref
}

func (p *proxy) blob(w http.ResponseWriter, r *http.Request, repo, digest string) {
	if _, err := os.Stat(p.blobPath(digest)); err == nil {
		p.serveFile(w, r, digest, "application/octet-stream")
		return
	}
	d, err := name.NewDigest(p.reg.RegistryStr()+"/"+repo+"@"+digest, name.Insecure)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	d.Repository.Registry = p.reg
	layer, err := remote.Layer(d, append(p.opts, remote.WithContext(r.Context()))...)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	rc, err := layer.Compressed()
	if err != nil {
		http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN"}]}`, http.StatusNotFound)
		return
	}
	defer rc.Close()
	h, _ := v1.NewHash(digest)
	if err := p.storeStream(h, rc); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	p.serveFile(w, r, digest, "application/octet-stream")
}

func (p *proxy) store(h v1.Hash, data []byte) error {
	return p.storeStream(h, strings.NewReader(string(data)))
}

// storeStream writes a blob to a temp file, verifies its digest and renames
// it into place, so the cache never holds a partial or wrong blob.
func (p *proxy) storeStream(h v1.Hash, r io.Reader) error {
	if _, err := os.Stat(p.blobPath(h.String())); err == nil {
		return nil
	}
	f, err := os.CreateTemp(filepath.Join(p.root, "tmp"), "blob-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	sum := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, sum), r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != h.Hex {
		return fmt.Errorf("digest mismatch: want %s, got sha256:%s", h, got)
	}
	return os.Rename(f.Name(), p.blobPath(h.String()))
}

func (p *proxy) readLink(repo, ref string) (tagLink, bool) {
	var l tagLink
	data, err := os.ReadFile(p.linkPath(repo, ref))
	if err != nil || json.Unmarshal(data, &l) != nil {
		return l, false
	}
	if _, err := os.Stat(p.blobPath(l.Digest)); err != nil {
		return l, false
	}
	return l, true
}

func (p *proxy) writeLink(repo, ref string, l tagLink) error {
	path := p.linkPath(repo, ref)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	data, _ := json.Marshal(l)
	return atomicfile.WriteFileNoSync(path, data, 0o644)
}

func (p *proxy) serveFile(w http.ResponseWriter, r *http.Request, digest, mediaType string) {
	f, err := os.Open(p.blobPath(digest))
	if errors.Is(err, os.ErrNotExist) {
		http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN"}]}`, http.StatusNotFound)
		return
	} else if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	st, _ := f.Stat()
	w.Header().Set("Docker-Content-Digest", digest)
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Content-Length", fmt.Sprint(st.Size()))
	if r.Method == http.MethodHead {
		return
	}
	io.Copy(w, f)
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
