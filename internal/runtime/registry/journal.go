package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

// journal keeps on disk the manifests pushed to the registry that are no
// image of the store (pkg/registry holds manifests in memory only): indexes,
// manifests pushed by digest, other platforms' images, artifacts such as
// helm charts. refs.json maps repository and reference (a tag or a digest)
// to a digest; manifests/sha256/<hex> holds each raw manifest once.
type journal struct {
	dir string

	mu     sync.Mutex
	refs   map[string]map[string]ref // repo → tag or digest → manifest
	pinned map[v1.Hash]bool          // blobs the journaled image manifests reference
}

type ref struct {
	Digest    string `json:"digest"`
	MediaType string `json:"mediaType"`
}

const refsFile = "refs.json"

func openJournal(dir string) (*journal, error) {
	if err := os.MkdirAll(filepath.Join(dir, "manifests", "sha256"), 0o700); err != nil {
		return nil, err
	}
	j := &journal{dir: dir, refs: map[string]map[string]ref{}}
	b, err := os.ReadFile(filepath.Join(dir, refsFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(b, &j.refs); err != nil {
			return nil, fmt.Errorf("registry journal %s: %w (remove it to start the registry without its pushed indexes)", filepath.Join(dir, refsFile), err)
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.repinLocked()
	return j, nil
}

func (j *journal) manifestPath(digest string) string {
	return filepath.Join(j.dir, "manifests", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

// put records repo/reference → raw (the manifest's digest is digest).
func (j *journal) put(repo, reference, digest, mediaType string, raw []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	p := j.manifestPath(digest)
	if _, err := os.Stat(p); err != nil {
		if err := atomicfile.WriteFileNoSync(p, raw, 0o600); err != nil {
			return err
		}
	}
	if j.refs[repo] == nil {
		j.refs[repo] = map[string]ref{}
	}
	r := ref{Digest: digest, MediaType: mediaType}
	j.refs[repo][digest] = r // as pkg/registry: a push by tag is reachable by digest too
	j.refs[repo][reference] = r
	return j.saveLocked()
}

// drop forgets repo/reference (a DELETE, or a tag the store now holds as
// an image); manifests no reference names any more go.
func (j *journal) drop(repo, reference string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.refs[repo][reference]; !ok {
		return nil
	}
	delete(j.refs[repo], reference)
	if len(j.refs[repo]) == 0 {
		delete(j.refs, repo)
	}
	return j.saveLocked()
}

func (j *journal) saveLocked() error {
	b, err := json.MarshalIndent(j.refs, "", " ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFileNoSync(filepath.Join(j.dir, refsFile), b, 0o600); err != nil {
		return err
	}
	used := map[string]bool{}
	for _, refs := range j.refs {
		for _, r := range refs {
			used[strings.TrimPrefix(r.Digest, "sha256:")] = true
		}
	}
	files, _ := os.ReadDir(filepath.Join(j.dir, "manifests", "sha256"))
	for _, f := range files {
		if !used[f.Name()] {
			os.Remove(filepath.Join(j.dir, "manifests", "sha256", f.Name()))
		}
	}
	j.repinLocked()
	return nil
}

func (j *journal) repinLocked() {
	pinned := map[v1.Hash]bool{}
	seen := map[string]bool{}
	for _, refs := range j.refs {
		for _, r := range refs {
			if seen[r.Digest] || !types.MediaType(r.MediaType).IsImage() {
				continue
			}
			seen[r.Digest] = true
			raw, err := os.ReadFile(j.manifestPath(r.Digest))
			if err != nil {
				continue
			}
			m, err := v1.ParseManifest(bytes.NewReader(raw))
			if err != nil {
				continue
			}
			pinned[m.Config.Digest] = true
			for _, l := range m.Layers {
				pinned[l.Digest] = true
			}
		}
	}
	j.pinned = pinned
}

// pins is what the store must keep for the journaled manifests.
func (j *journal) pins() map[v1.Hash]bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.pinned
}

// entry is one journaled reference with its manifest.
type entry struct {
	repo, reference string
	ref
	raw []byte
}

// entries lists what to push back into a new registry: references by
// digest before tags, image manifests before indexes (an index is refused
// until its manifests are there).
func (j *journal) entries() []entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []entry
	for repo, refs := range j.refs {
		for reference, r := range refs {
			raw, err := os.ReadFile(j.manifestPath(r.Digest))
			if err != nil {
				continue
			}
			out = append(out, entry{repo: repo, reference: reference, ref: r, raw: raw})
		}
	}
	rank := func(e entry) int {
		n := 0
		if !strings.HasPrefix(e.reference, "sha256:") {
			n += 2
		}
		if types.MediaType(e.MediaType).IsIndex() {
			n++
		}
		return n
	}
	sort.Slice(out, func(a, b int) bool {
		if ra, rb := rank(out[a]), rank(out[b]); ra != rb {
			return ra < rb
		}
		return out[a].repo+"@"+out[a].reference < out[b].repo+"@"+out[b].reference
	})
	return out
}
