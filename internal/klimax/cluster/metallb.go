package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/klimax/slot"
)

// MetalLB object names and namespace.
const (
	MetalLBNamespace = "metallb-system"
	MetalLBPoolName  = "klimax"
)

// MetalLBObjects returns the IPAddressPool and L2Advertisement giving slot s
// its slice <prefix>.s.1-7 and <prefix>.s.16-254 of the kind bridge.
func MetalLBObjects(s slot.Slot, bridgePrefix string) []*unstructured.Unstructured {
	addrs := []any{}
	for _, r := range s.MetalLBRanges(bridgePrefix) {
		addrs = append(addrs, r)
	}
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metallb.io/v1beta1",
		"kind":       "IPAddressPool",
		"metadata":   map[string]any{"name": MetalLBPoolName, "namespace": MetalLBNamespace},
		"spec":       map[string]any{"addresses": addrs},
	}}
	l2 := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metallb.io/v1beta1",
		"kind":       "L2Advertisement",
		"metadata":   map[string]any{"name": MetalLBPoolName, "namespace": MetalLBNamespace},
		"spec":       map[string]any{"ipAddressPools": []any{MetalLBPoolName}},
	}}
	return []*unstructured.Unstructured{pool, l2}
}

// Manifests fetches pinned upstream install manifests (MetalLB,
// metrics-server) once and caches them under Dir, so later clusters install
// offline and every cluster gets byte-identical objects.
type Manifests struct {
	Dir string // e.g. ~/.klimax/cache/manifests
	// MetalLBURL and MetricsServerURL are format strings taking the version;
	// tests point them at a local server.
	MetalLBURL       string
	MetricsServerURL string
	Client           *http.Client
}

// Default manifest locations (pinned by the version in the path).
const (
	DefaultMetalLBURL       = "https://raw.githubusercontent.com/metallb/metallb/%s/config/manifests/metallb-native.yaml"
	DefaultMetricsServerURL = "https://github.com/kubernetes-sigs/metrics-server/releases/download/%s/components.yaml"
)

var manifestVersionRe = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)

// MetalLB returns the parsed MetalLB install manifest for version.
func (m *Manifests) MetalLB(ctx context.Context, version string) ([]*unstructured.Unstructured, error) {
	return m.get(ctx, "metallb", m.MetalLBURL, DefaultMetalLBURL, version)
}

// MetricsServer returns the parsed metrics-server manifest for version.
func (m *Manifests) MetricsServer(ctx context.Context, version string) ([]*unstructured.Unstructured, error) {
	return m.get(ctx, "metrics-server", m.MetricsServerURL, DefaultMetricsServerURL, version)
}

// Seed stores the MetalLB manifest for version in the cache unless one is
// there, so clusters install it without downloading (`klimax node-image
// build` seeds the manifest of the MetalLB it preloads).
func (m *Manifests) Seed(version string, data []byte) (bool, error) {
	if !manifestVersionRe.MatchString(version) {
		return false, fmt.Errorf("metallb version %q is not a release tag like v0.16.1", version)
	}
	if objs, err := ParseManifest(data); err != nil || len(objs) == 0 {
		return false, fmt.Errorf("metallb %s manifest is not a Kubernetes manifest: %v", version, err)
	}
	cache := filepath.Join(m.Dir, "metallb", version+".yaml")
	if _, err := os.Stat(cache); err == nil {
		return false, nil
	}
	return true, atomicfile.WriteFile(cache, data, 0o644)
}

func (m *Manifests) get(ctx context.Context, what, urlFmt, def, version string) ([]*unstructured.Unstructured, error) {
	if !manifestVersionRe.MatchString(version) {
		return nil, fmt.Errorf("%s version %q is not a release tag like v0.16.1", what, version)
	}
	if urlFmt == "" {
		urlFmt = def
	}
	cache := filepath.Join(m.Dir, what, version+".yaml")
	data, err := os.ReadFile(cache)
	if err != nil {
		data, err = m.download(ctx, fmt.Sprintf(urlFmt, version))
		if err != nil {
			return nil, fmt.Errorf("download %s %s manifest: %w", what, version, err)
		}
		objs, perr := ParseManifest(data)
		if perr != nil || len(objs) == 0 {
			return nil, fmt.Errorf("%s %s manifest is not a Kubernetes manifest: %v", what, version, perr)
		}
		// Atomic: parallel fleet creates may download and read it at once.
		_ = atomicfile.WriteFile(cache, data, 0o644)
		return objs, nil
	}
	return ParseManifest(data)
}

func (m *Manifests) download(ctx context.Context, url string) ([]byte, error) {
	c := m.Client
	if c == nil {
		c = &http.Client{Timeout: 2 * time.Minute}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 32<<20))
}

// ParseManifest splits a multi-document YAML manifest into objects, skipping
// empty documents.
func ParseManifest(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("object without kind/apiVersion in manifest")
		}
		out = append(out, u)
	}
}

// MetricsServerTweaks adds --kubelet-insecure-tls to the metrics-server
// container when asked (kind's kubelet serving certs are self-signed).
func MetricsServerTweaks(objs []*unstructured.Unstructured, insecureTLS bool) error {
	if !insecureTLS {
		return nil
	}
	for _, o := range objs {
		if o.GetKind() != "Deployment" || o.GetName() != "metrics-server" {
			continue
		}
		cs, found, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		if err != nil || !found || len(cs) == 0 {
			return fmt.Errorf("metrics-server Deployment has no containers")
		}
		c := cs[0].(map[string]any)
		args, _ := c["args"].([]any)
		for _, a := range args {
			if a == "--kubelet-insecure-tls" {
				return nil
			}
		}
		c["args"] = append(args, "--kubelet-insecure-tls")
		return unstructured.SetNestedSlice(o.Object, cs, "spec", "template", "spec", "containers")
	}
	return fmt.Errorf("metrics-server manifest has no metrics-server Deployment")
}
