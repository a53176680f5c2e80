// Package kubeconfig owns safe edits of kubeconfig files shared with other
// tools (typically ~/.kube/config): merging a generated kubeconfig in and
// removing exactly what was merged, atomically, with a backup, and without
// losing anything it does not understand. It works on the YAML node tree, not
// on client-go structs, so unknown keys, extensions, ordering and comments of
// the user's file survive.
package kubeconfig

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"

	"go.yaml.in/yaml/v3"
)

// The three named lists of a kubeconfig.
const (
	keyClusters = "clusters"
	keyUsers    = "users"
	keyContexts = "contexts"
	keyCurrent  = "current-context"
)

// MergeOptions tune Merge.
type MergeOptions struct {
	// SetCurrentContext makes the merged kubeconfig's current-context (or its
	// only context) the file's current-context.
	SetCurrentContext bool
	// NoBackup skips copying the old file to BackupPath(path).
	NoBackup bool
}

// BackupPath is where Merge and Remove keep the previous version of path.
func BackupPath(path string) string { return path + ".bak" }

// mu serialises writers within one process, so they queue here instead of
// polling for each other's lock file.
var mu sync.Mutex

// Merge adds every cluster, user and context of kubeconfigYAML to the
// kubeconfig at path (created if missing), replacing same-named entries in
// place and keeping everything else, including keys it does not know. The
// file is written atomically with mode 0600; the old file is copied to
// BackupPath(path) first. It returns the backup path ("" if none was made).
func Merge(path string, kubeconfigYAML []byte, opts MergeOptions) (string, error) {
	in, err := parseDoc(kubeconfigYAML, "kubeconfig to merge")
	if err != nil {
		return "", err
	}
	if err := checkRefs(in); err != nil {
		return "", fmt.Errorf("kubeconfig to merge: %w", err)
	}
	ctxs := namedEntries(in, keyContexts)
	if len(ctxs) == 0 {
		return "", errors.New("kubeconfig to merge has no contexts")
	}
	var backup string
	err = update(path, opts.NoBackup, &backup, func(doc *yaml.Node) error {
		for _, key := range []string{keyClusters, keyUsers, keyContexts} {
			for _, e := range namedEntries(in, key) {
				upsert(doc, key, e)
			}
		}
		if opts.SetCurrentContext {
			cur := scalar(in, keyCurrent)
			if cur == "" {
				cur = entryName(ctxs[0])
			}
			setScalar(doc, keyCurrent, cur)
		}
		return nil
	})
	return backup, err
}

// Remove deletes the named contexts from the kubeconfig at path, and the
// clusters and users they reference when no remaining context uses them —
// exactly what Merge added for those contexts. Unknown names are ignored; a
// missing file is not an error. current-context is cleared if it was removed.
func Remove(path string, contextNames []string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var backup string
	return update(path, false, &backup, func(doc *yaml.Node) error {
		drop := map[string]bool{}
		for _, n := range contextNames {
			drop[n] = true
		}
		clusters, users := map[string]bool{}, map[string]bool{}
		for _, c := range namedEntries(doc, keyContexts) {
			if drop[entryName(c)] {
				clusters[ctxRef(c, "cluster")] = true
				users[ctxRef(c, "user")] = true
			}
		}
		removeEntries(doc, keyContexts, drop)
		for _, c := range namedEntries(doc, keyContexts) {
			delete(clusters, ctxRef(c, "cluster"))
			delete(users, ctxRef(c, "user"))
		}
		removeEntries(doc, keyClusters, clusters)
		removeEntries(doc, keyUsers, users)
		if drop[scalar(doc, keyCurrent)] {
			setScalar(doc, keyCurrent, "")
		}
		return nil
	})
}

// UseContext sets current-context of the file at path; the context must exist.
func UseContext(path, context string) error {
	var backup string
	return update(path, true, &backup, func(doc *yaml.Node) error {
		for _, c := range namedEntries(doc, keyContexts) {
			if entryName(c) == context {
				setScalar(doc, keyCurrent, context)
				return nil
			}
		}
		return fmt.Errorf("context %q not found in %s (merge it first: klimax kubeconfig merge <name>)", context, path)
	})
}

// ContextNames lists the contexts of a kubeconfig document.
func ContextNames(kubeconfigYAML []byte) ([]string, error) {
	doc, err := parseDoc(kubeconfigYAML, "kubeconfig")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range namedEntries(doc, keyContexts) {
		out = append(out, entryName(c))
	}
	return out, nil
}

// RewriteServer sets the server URL of every cluster in kubeconfigYAML, e.g.
// to https://192.168.64.3:7001, keeping the rest of the document.
func RewriteServer(kubeconfigYAML []byte, server string) ([]byte, error) {
	doc, err := parseDoc(kubeconfigYAML, "kubeconfig")
	if err != nil {
		return nil, err
	}
	cl := namedEntries(doc, keyClusters)
	if len(cl) == 0 {
		return nil, errors.New("kubeconfig has no clusters to rewrite")
	}
	for _, c := range cl {
		body := mapGet(c, "cluster")
		if body == nil || body.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("cluster %q has no cluster: section", entryName(c))
		}
		mapSet(body, "server", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: server})
	}
	return encode(doc)
}

// Server returns the server URL of the named cluster (first cluster if name is "").
func Server(kubeconfigYAML []byte, cluster string) (string, error) {
	doc, err := parseDoc(kubeconfigYAML, "kubeconfig")
	if err != nil {
		return "", err
	}
	for _, c := range namedEntries(doc, keyClusters) {
		if cluster == "" || entryName(c) == cluster {
			if s := mapGet(mapGet(c, "cluster"), "server"); s != nil {
				return s.Value, nil
			}
		}
	}
	return "", fmt.Errorf("cluster %q not found", cluster)
}

// update runs fn on the parsed file under a lock and writes the result.
func update(path string, noBackup bool, backup *string, fn func(doc *yaml.Node) error) error {
	mu.Lock()
	defer mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	unlock, err := lockFile(path)
	if err != nil {
		return err
	}
	defer unlock()

	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	exists := err == nil
	var doc *yaml.Node
	if len(bytes.TrimSpace(old)) == 0 {
		doc = newDoc()
	} else if doc, err = parseDoc(old, path); err != nil {
		return fmt.Errorf("%w (the file was not changed; fix or move it away)", err)
	}
	if err := fn(doc); err != nil {
		return err
	}
	out, err := encode(doc)
	if err != nil {
		return err
	}
	if exists && bytes.Equal(out, old) {
		return nil
	}
	if exists && !noBackup {
		if err := atomicfile.WriteFile(BackupPath(path), old, 0o600); err != nil {
			return fmt.Errorf("backup %s: %w", path, err)
		}
		*backup = BackupPath(path)
	}
	return atomicfile.WriteFile(path, out, 0o600)
}

func newDoc() *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	mapSet(m, "apiVersion", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "v1"})
	mapSet(m, "kind", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "Config"})
	for _, k := range []string{keyClusters, keyContexts, keyUsers} {
		mapSet(m, k, &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"})
	}
	mapSet(m, keyCurrent, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: ""})
	return &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{m}}
}

func parseDoc(data []byte, what string) (*yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: not valid YAML: %w", what, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: not a kubeconfig (expected a YAML mapping)", what)
	}
	root := doc.Content[0]
	for _, key := range []string{keyClusters, keyUsers, keyContexts} {
		n := mapGet(root, key)
		if n == nil || n.Tag == "!!null" {
			continue
		}
		if n.Kind != yaml.SequenceNode {
			return nil, fmt.Errorf("%s: %s must be a list", what, key)
		}
		seen := map[string]bool{}
		for i, e := range n.Content {
			name := entryName(e)
			if e.Kind != yaml.MappingNode || name == "" {
				return nil, fmt.Errorf("%s: %s[%d] has no name", what, key, i)
			}
			if seen[name] {
				return nil, fmt.Errorf("%s: %s has %q twice", what, key, name)
			}
			seen[name] = true
		}
	}
	return &doc, nil
}

func checkRefs(doc *yaml.Node) error {
	have := map[string]map[string]bool{"cluster": {}, "user": {}}
	for _, c := range namedEntries(doc, keyClusters) {
		have["cluster"][entryName(c)] = true
	}
	for _, u := range namedEntries(doc, keyUsers) {
		have["user"][entryName(u)] = true
	}
	for _, c := range namedEntries(doc, keyContexts) {
		for _, ref := range []string{"cluster", "user"} {
			if r := ctxRef(c, ref); !have[ref][r] {
				return fmt.Errorf("context %q references %s %q which is not defined", entryName(c), ref, r)
			}
		}
	}
	return nil
}

func encode(doc *yaml.Node) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	enc.CompactSeqIndent() // kubectl style: "- name:" under the key
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func root(doc *yaml.Node) *yaml.Node {
	if doc.Kind == yaml.DocumentNode {
		return doc.Content[0]
	}
	return doc
}

func mapGet(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func mapSet(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
}

func scalar(doc *yaml.Node, key string) string {
	if n := mapGet(root(doc), key); n != nil && n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return ""
}

func setScalar(doc *yaml.Node, key, val string) {
	mapSet(root(doc), key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: val})
}

func namedEntries(doc *yaml.Node, key string) []*yaml.Node {
	n := mapGet(root(doc), key)
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	return n.Content
}

func entryName(e *yaml.Node) string {
	if n := mapGet(e, "name"); n != nil && n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return ""
}

func ctxRef(ctx *yaml.Node, field string) string {
	if n := mapGet(mapGet(ctx, "context"), field); n != nil {
		return n.Value
	}
	return ""
}

func upsert(doc *yaml.Node, key string, e *yaml.Node) {
	r := root(doc)
	list := mapGet(r, key)
	if list == nil || list.Kind != yaml.SequenceNode {
		list = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		mapSet(r, key, list)
	}
	list.Style = 0 // an empty "[]" flow list would otherwise render the entries inline
	name := entryName(e)
	for i, old := range list.Content {
		if entryName(old) == name {
			list.Content[i] = e
			return
		}
	}
	list.Content = append(list.Content, e)
}

func removeEntries(doc *yaml.Node, key string, names map[string]bool) {
	list := mapGet(root(doc), key)
	if list == nil || list.Kind != yaml.SequenceNode {
		return
	}
	kept := list.Content[:0]
	for _, e := range list.Content {
		if !names[entryName(e)] {
			kept = append(kept, e)
		}
	}
	list.Content = kept
	if len(kept) == 0 {
		list.Style = yaml.FlowStyle // "[]", as kubectl writes an empty list
	}
}
