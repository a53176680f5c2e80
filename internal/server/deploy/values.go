package deploy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// secretRef is one entry of spec.valuesSecrets.
type secretRef struct {
	Name          string
	Keys          []string
	IgnoreUpdates bool // the Secret is optional and its changes do not upgrade
}

// valuesSpec is the spec of the HelmChart or of its HelmChartConfig.
type valuesSpec struct {
	owner string // prefixes errors: "" for the HelmChart, "HelmChartConfig ns/name " for the other
	spec  map[string]any
}

// readValuesSecrets parses spec.valuesSecrets.
func readValuesSecrets(owner string, spec map[string]any) ([]secretRef, error) {
	raw, ok := spec["valuesSecrets"]
	if !ok || raw == nil {
		return nil, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("%sspec.valuesSecrets: give a list of {name, keys, ignoreUpdates}, not %v", owner, raw)
	}
	out := make([]secretRef, 0, len(list))
	for i, e := range list {
		m, ok := e.(map[string]any)
		name, _ := m["name"].(string)
		if !ok || name == "" {
			return nil, fmt.Errorf("%sspec.valuesSecrets[%d]: give {name: SECRET, keys: [KEY]} naming a Secret in the HelmChart's namespace, not %v", owner, i, e)
		}
		r := secretRef{Name: name}
		r.IgnoreUpdates, _ = m["ignoreUpdates"].(bool)
		if ks, ok := m["keys"]; ok && ks != nil {
			kl, ok := ks.([]any)
			if !ok {
				return nil, fmt.Errorf("%sspec.valuesSecrets[%d].keys: give a list of key names, not %v", owner, i, ks)
			}
			for _, k := range kl {
				s, ok := k.(string)
				if !ok || s == "" {
					return nil, fmt.Errorf("%sspec.valuesSecrets[%d].keys: %v is not a key name", owner, i, k)
				}
				r.Keys = append(r.Keys, s)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// layer is one values document, in the order helm would get it as -f.
type layer struct {
	Source string         // e.g. "spec.valuesSecrets[0] Secret kube-system/x key values.yaml"
	Values map[string]any `json:"-"`
	// Watched: it counts for the digest; false for a Secret with
	// ignoreUpdates, so a change of it alone does not upgrade.
	Watched bool
}

// secretGetter reads a Secret; nil, nil when it does not exist.
type secretGetter func(ctx context.Context, ns, name string) (*corev1.Secret, error)

// valueLayers reads the layers of the HelmChart and then of its
// HelmChartConfig (cfg may be nil): for each, valuesContent, then values,
// then valuesSecrets in list order, each Secret's keys in order.
func valueLayers(ctx context.Context, get secretGetter, hc, cfg *unstructured.Unstructured) ([]layer, error) {
	specs := []valuesSpec{{spec: specOf(hc)}}
	if cfg != nil {
		specs = append(specs, valuesSpec{owner: fmt.Sprintf("HelmChartConfig %s/%s ", cfg.GetNamespace(), cfg.GetName()), spec: specOf(cfg)})
	}
	ns := hc.GetNamespace()
	var out []layer
	for _, s := range specs {
		if content, _ := s.spec["valuesContent"].(string); content != "" {
			v, err := readValues([]byte(content))
			if err != nil {
				return nil, fmt.Errorf("%sspec.valuesContent: %w", s.owner, err)
			}
			out = append(out, layer{Source: s.owner + "spec.valuesContent", Values: v, Watched: true})
		}
		if raw, ok := s.spec["values"]; ok && raw != nil {
			m, ok := raw.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%sspec.values: give an object of values (as in values.yaml), not %v", s.owner, raw)
			}
			out = append(out, layer{Source: s.owner + "spec.values", Values: runtime.DeepCopyJSON(m), Watched: true})
		}
		refs, err := readValuesSecrets(s.owner, s.spec)
		if err != nil {
			return nil, err
		}
		for i, r := range refs {
			if len(r.Keys) == 0 {
				continue // as k3s: a Secret without keys is not read
			}
			field := fmt.Sprintf("%sspec.valuesSecrets[%d]", s.owner, i)
			sec, err := get(ctx, ns, r.Name)
			if err != nil {
				return nil, fmt.Errorf("%s: Secret %s/%s: %w", field, ns, r.Name, err)
			}
			if sec == nil {
				if r.IgnoreUpdates {
					continue // optional
				}
				return nil, fmt.Errorf("%s: Secret %s/%s not found (it must be in the HelmChart's namespace): create it with the values under key %s (kubectl create secret generic %s -n %s --from-file=%s=values.yaml), or set ignoreUpdates: true to make it optional",
					field, ns, r.Name, r.Keys[0], r.Name, ns, r.Keys[0])
			}
			for _, k := range r.Keys {
				data, ok := sec.Data[k]
				if !ok {
					if r.IgnoreUpdates {
						continue
					}
					return nil, fmt.Errorf("%s: Secret %s/%s has no key %s (it has %s): add the key, or remove it from keys", field, ns, r.Name, k, keyList(sec.Data))
				}
				v, err := readValues(data)
				if err != nil {
					return nil, fmt.Errorf("%s: Secret %s/%s key %s is not a YAML values document: %w", field, ns, r.Name, k, err)
				}
				out = append(out, layer{Source: fmt.Sprintf("%s Secret %s/%s key %s", field, ns, r.Name, k), Values: v, Watched: !r.IgnoreUpdates})
			}
		}
	}
	return out, nil
}

func specOf(u *unstructured.Unstructured) map[string]any {
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	if spec == nil {
		return map[string]any{}
	}
	return spec
}

// readValues parses a values document as helm's chartutil.ReadValues
// does (YAML through JSON, so numbers are float64; empty is {}), without
// linking helm into k3sm.
func readValues(data []byte) (map[string]any, error) {
	var v map[string]any
	err := yaml.Unmarshal(data, &v)
	if len(v) == 0 {
		v = map[string]any{}
	}
	return v, err
}

// mergeValues merges the layers as helm merges repeated -f files: maps
// merge key by key, anything else in a later layer replaces.
func mergeValues(layers []layer) map[string]any {
	out := map[string]any{}
	for _, l := range layers {
		out = mergeInto(out, l.Values)
	}
	return out
}

func mergeInto(dst, src map[string]any) map[string]any {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				dst[k] = mergeInto(dm, sm)
				continue
			}
			dst[k] = mergeInto(map[string]any{}, sm)
			continue
		}
		dst[k] = v
	}
	return dst
}

// valuesDigest is a SHA-256 over what decides the release's values: each
// layer's source and content, and spec.set. Secrets with ignoreUpdates are
// left out, so neither their content nor their creation upgrades alone.
func valuesDigest(layers []layer, hc *unstructured.Unstructured) (string, error) {
	type entry struct {
		Source string         `json:"source"`
		Values map[string]any `json:"values,omitempty"`
	}
	doc := struct {
		Layers []entry        `json:"layers"`
		Set    map[string]any `json:"set,omitempty"`
	}{}
	for _, l := range layers {
		if l.Watched {
			doc.Layers = append(doc.Layers, entry{Source: l.Source, Values: l.Values})
		}
	}
	doc.Set, _, _ = unstructured.NestedMap(hc.Object, "spec", "set")
	// encoding/json sorts map keys, so equal values give equal bytes.
	b, err := json.Marshal(doc)
	if err != nil {
		return "", fmt.Errorf("values digest: %w", err)
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// valuesSecretNames are the Secrets whose changes upgrade the chart: the
// valuesSecrets of spec (HelmChart or HelmChartConfig) without
// ignoreUpdates.
func valuesSecretNames(spec map[string]any) []string {
	refs, err := readValuesSecrets("", spec)
	if err != nil {
		return nil
	}
	var out []string
	for _, r := range refs {
		if !r.IgnoreUpdates && len(r.Keys) > 0 {
			out = append(out, r.Name)
		}
	}
	return out
}

// kubeSecretGetter reads Secrets through the API (always fresh: the
// controller watches only their metadata).
func kubeSecretGetter(c *Charts) secretGetter {
	return func(ctx context.Context, ns, name string) (*corev1.Secret, error) {
		sec, err := c.kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return sec, err
	}
}
