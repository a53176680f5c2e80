//go:build linux

package main

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// manifest is what test/utils/image/manifest.go of the pinned
// k8s.io/kubernetes says: the KUBE_TEST_REPO_LIST keys, their upstream
// defaults and every ImageID's registry field, name and tag. Parsed from
// the source (not copied here) so the tags are always the ones e2e.test
// asks for.
type manifest struct {
	// yamlKey maps a RegistryList field (PromoterE2eRegistry) to its YAML
	// key (promoterE2eRegistry); fields keeps their order in the struct.
	yamlKey  map[string]string
	fields   []string
	defaults map[string]string // field -> upstream registry
	images   map[string]imageConfig
}

// imageConfig is one configs[ID] = Config{list.Field, "name", "version"}.
type imageConfig struct {
	field, name, version string
}

var (
	reStructField = regexp.MustCompile("(?m)^\\s*(\\w+)\\s+string\\s+`yaml:\"(\\w+)\"`")
	reDefault     = regexp.MustCompile(`(?m)^\s*(\w+):\s*"([^"]+)",`)
	reConfig      = regexp.MustCompile(`configs\[(\w+)\]\s*=\s*Config\{list\.(\w+),\s*"([^"]+)",\s*"([^"]+)"\}`)
)

func parseManifestFile(path string) (*manifest, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the upstream image manifest: %w", err)
	}
	m, err := parseManifest(string(src))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

func parseManifest(src string) (*manifest, error) {
	m := &manifest{yamlKey: map[string]string{}, defaults: map[string]string{}, images: map[string]imageConfig{}}
	structStart := strings.Index(src, "type RegistryList struct {")
	if structStart < 0 {
		return nil, fmt.Errorf("no RegistryList struct")
	}
	structEnd := strings.Index(src[structStart:], "\n}")
	for _, sm := range reStructField.FindAllStringSubmatch(src[structStart:structStart+structEnd], -1) {
		m.yamlKey[sm[1]] = sm[2]
		m.fields = append(m.fields, sm[1])
	}
	initStart := strings.Index(src, "initRegistry = RegistryList{")
	if initStart < 0 {
		return nil, fmt.Errorf("no initRegistry")
	}
	initEnd := strings.Index(src[initStart:], "\n\t}")
	if initEnd < 0 {
		return nil, fmt.Errorf("initRegistry does not end")
	}
	for _, sm := range reDefault.FindAllStringSubmatch(src[initStart:initStart+initEnd], -1) {
		m.defaults[sm[1]] = sm[2]
	}
	for _, sm := range reConfig.FindAllStringSubmatch(src, -1) {
		m.images[sm[1]] = imageConfig{field: sm[2], name: sm[3], version: sm[4]}
	}
	if len(m.fields) == 0 || len(m.images) == 0 {
		return nil, fmt.Errorf("found no registry fields or no image configs: the file's layout changed, update parseManifest")
	}
	for _, f := range m.fields {
		if m.defaults[f] == "" {
			return nil, fmt.Errorf("registry field %s has no upstream default in initRegistry", f)
		}
	}
	for id, c := range m.images {
		if _, ok := m.yamlKey[c.field]; !ok {
			return nil, fmt.Errorf("image %s uses unknown registry field %s", id, c.field)
		}
	}
	return m, nil
}

// keepUpstream are registries that stay as upstream has them: specs expect
// pulls from invalidRegistry to fail, and privateRegistry's specs (which
// need credentials) are not conformance.
var keepUpstream = map[string]bool{"InvalidRegistry": true, "PrivateRegistry": true}

// registries maps every RegistryList field onto host: the upstream
// registry's host part is replaced and its path kept, so
// registry.k8s.io/e2e-test-images becomes HOST/e2e-test-images and
// registry.k8s.io becomes HOST.
func (m *manifest) registries(host string) map[string]string {
	out := map[string]string{}
	for _, f := range m.fields {
		def := m.defaults[f]
		if keepUpstream[f] {
			out[f] = def
			continue
		}
		if _, rest, ok := strings.Cut(def, "/"); ok {
			out[f] = host + "/" + rest
		} else {
			out[f] = host
		}
	}
	return out
}

// repoListYAML is the KUBE_TEST_REPO_LIST file for host.
func (m *manifest) repoListYAML(host string) string {
	regs := m.registries(host)
	var b strings.Builder
	b.WriteString("# KUBE_TEST_REPO_LIST for e2e.test: the registries of test/utils/image/manifest.go\n")
	b.WriteString("# mapped onto " + host + " (invalidRegistry and privateRegistry as upstream).\n")
	for _, f := range m.fields {
		fmt.Fprintf(&b, "%s: %q\n", m.yamlKey[f], regs[f])
	}
	return b.String()
}

// ref is the full reference of an image config under host.
func (m *manifest) ref(host string, c imageConfig) string {
	return m.registries(host)[c.field] + "/" + c.name + ":" + c.version
}

// upstreamRef is the reference e2e.test uses without a repo list.
func (m *manifest) upstreamRef(c imageConfig) string {
	return m.defaults[c.field] + "/" + c.name + ":" + c.version
}

// ids lists the manifest's image IDs, sorted.
func (m *manifest) ids() []string {
	var ids []string
	for id := range m.images {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// fileName is the tarball name of ref: its repository path and tag, with
// the registry host dropped ("HOST/e2e-test-images/agnhost:2.66.1" ->
// "e2e-test-images_agnhost_2.66.1.tar").
func fileName(ref string) string {
	_, rest, ok := strings.Cut(ref, "/")
	if !ok {
		rest = ref
	}
	return strings.NewReplacer("/", "_", ":", "_", "@", "_").Replace(rest) + ".tar"
}
