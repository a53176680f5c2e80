package deploy

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// secrets serves Secrets of namespace kube-system from a map (name -> key -> YAML).
func secrets(m map[string]map[string]string) secretGetter {
	return func(_ context.Context, ns, name string) (*corev1.Secret, error) {
		d, ok := m[name]
		if !ok || ns != "kube-system" {
			return nil, nil
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string][]byte{}}
		for k, v := range d {
			sec.Data[k] = []byte(v)
		}
		return sec, nil
	}
}

func obj(kind, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "helm.cattle.io/v1", "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": "kube-system"},
		"spec":     spec,
	}}
}

func list(v ...any) []any { return v }

// Every layer sets "who" (so the last wins) and a key of its own (so all
// are merged), and one nested map is merged key by key.
func TestValueLayersOrder(t *testing.T) {
	get := secrets(map[string]map[string]string{
		"s1": {"a": "who: s1a\ns1a: 1\nnested: {x: s1a}\n", "b": "who: s1b\ns1b: 1\n"},
		"s2": {"c": "who: s2c\ns2c: 1\n"},
		"s3": {"d": "who: cfg-s3d\ns3d: 1\nnested: {w: cfg}\n"},
	})
	hc := obj("HelmChart", "app", map[string]any{
		"valuesContent": "who: content\ncontent: 1\nnested: {x: content, z: content}\n",
		"values":        map[string]any{"who": "values", "values": int64(1)},
		"valuesSecrets": list(
			map[string]any{"name": "s1", "keys": list("b", "a")}, // keys in the order given
			map[string]any{"name": "s2", "keys": list("c")},
			map[string]any{"name": "unused"}, // no keys: not read, so not missing either
		),
		"set": map[string]any{"setonly": "true"},
	})
	cfg := obj("HelmChartConfig", "app", map[string]any{
		"valuesContent": "who: cfg-content\ncfgcontent: 1\n",
		"values":        map[string]any{"who": "cfg-values", "cfgvalues": int64(1)},
		"valuesSecrets": list(map[string]any{"name": "s3", "keys": list("d")}),
	})
	layers, err := valueLayers(context.Background(), get, hc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var sources []string
	for _, l := range layers {
		sources = append(sources, l.Source)
	}
	want := []string{
		"spec.valuesContent",
		"spec.values",
		"spec.valuesSecrets[0] Secret kube-system/s1 key b",
		"spec.valuesSecrets[0] Secret kube-system/s1 key a",
		"spec.valuesSecrets[1] Secret kube-system/s2 key c",
		"HelmChartConfig kube-system/app spec.valuesContent",
		"HelmChartConfig kube-system/app spec.values",
		"HelmChartConfig kube-system/app spec.valuesSecrets[0] Secret kube-system/s3 key d",
	}
	if !reflect.DeepEqual(sources, want) {
		t.Fatalf("layers\n%q\nwant\n%q", sources, want)
	}
	// spec.set is applied over these by k3sm-helm (helmop's tests).
	vals := mergeValues(layers)
	if vals["who"] != "cfg-s3d" {
		t.Errorf("who = %v, want the HelmChartConfig's last Secret", vals["who"])
	}
	for _, k := range []string{"content", "values", "s1a", "s1b", "s2c", "cfgcontent", "cfgvalues", "s3d"} {
		if vals[k] == nil {
			t.Errorf("the layer with %s was not merged: %v", k, vals)
		}
	}
	if n := vals["nested"]; !reflect.DeepEqual(n, map[string]any{"x": "s1a", "w": "cfg", "z": "content"}) {
		t.Errorf("nested = %v: maps must merge key by key", n)
	}

	// Without the HelmChartConfig the HelmChart's last Secret wins.
	layers, err = valueLayers(context.Background(), get, hc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := mergeValues(layers)["who"]; got != "s2c" {
		t.Errorf("who without the config = %v, want s2c", got)
	}
}

func TestValuesSecretErrors(t *testing.T) {
	get := secrets(map[string]map[string]string{"have": {"values.yaml": "a: 1\n", "bad": "a: [\n"}})
	for _, tc := range []struct {
		name string
		ref  any
		cfg  bool
		want []string // "" means no error
	}{
		{"missing", map[string]any{"name": "nope", "keys": list("values.yaml")}, false,
			[]string{"spec.valuesSecrets[0]: Secret kube-system/nope not found", "kubectl create secret generic nope -n kube-system --from-file=values.yaml=values.yaml", "ignoreUpdates: true"}},
		{"missing in the config", map[string]any{"name": "nope", "keys": list("values.yaml")}, true,
			[]string{"HelmChartConfig kube-system/app spec.valuesSecrets[0]: Secret kube-system/nope not found"}},
		{"missing key", map[string]any{"name": "have", "keys": list("other")}, false,
			[]string{"Secret kube-system/have has no key other (it has keys bad, values.yaml)"}},
		{"not YAML", map[string]any{"name": "have", "keys": list("bad")}, false,
			[]string{"Secret kube-system/have key bad is not a YAML values document"}},
		{"no name", map[string]any{"keys": list("x")}, false, []string{"spec.valuesSecrets[0]: give {name: SECRET"}},
		{"keys not a list", map[string]any{"name": "have", "keys": "values.yaml"}, false, []string{"spec.valuesSecrets[0].keys: give a list"}},
		{"optional and missing", map[string]any{"name": "nope", "keys": list("values.yaml"), "ignoreUpdates": true}, false, nil},
		{"optional, key missing", map[string]any{"name": "have", "keys": list("other"), "ignoreUpdates": true}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := map[string]any{"valuesSecrets": list(tc.ref)}
			hc, cfg := obj("HelmChart", "app", spec), (*unstructured.Unstructured)(nil)
			if tc.cfg {
				hc, cfg = obj("HelmChart", "app", map[string]any{}), obj("HelmChartConfig", "app", spec)
			}
			layers, err := valueLayers(context.Background(), get, hc, cfg)
			if tc.want == nil {
				if err != nil || len(layers) != 0 {
					t.Fatalf("layers %v, err %v; want none and no error", layers, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestValuesDigest(t *testing.T) {
	data := map[string]map[string]string{
		"watched":  {"v": "a: 1\nb: {c: 2, d: 3}\n"},
		"optional": {"v": "o: 1\n"},
	}
	hc := obj("HelmChart", "app", map[string]any{
		"valuesContent": "x: 1\n",
		"valuesSecrets": list(
			map[string]any{"name": "watched", "keys": list("v")},
			map[string]any{"name": "optional", "keys": list("v"), "ignoreUpdates": true},
		),
	})
	digest := func(cfg *unstructured.Unstructured) string {
		t.Helper()
		layers, err := valueLayers(context.Background(), secrets(data), hc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		d, err := valuesDigest(layers, hc)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d0 := digest(nil)
	if !strings.HasPrefix(d0, "sha256:") || len(d0) != len("sha256:")+64 {
		t.Fatalf("digest %q", d0)
	}
	if d := digest(nil); d != d0 {
		t.Fatalf("the same values gave %s then %s", d0, d)
	}
	// The same document written otherwise (key order, spacing) is the same values.
	data["watched"]["v"] = "b:\n  d: 3\n  c: 2\na: 1\n"
	if d := digest(nil); d != d0 {
		t.Errorf("a reordered but equal Secret changed the digest")
	}
	// A Secret with ignoreUpdates does not count: not its content, nor
	// whether it exists.
	data["optional"]["v"] = "o: 2\n"
	if d := digest(nil); d != d0 {
		t.Errorf("a change of an ignoreUpdates Secret changed the digest")
	}
	delete(data, "optional")
	if d := digest(nil); d != d0 {
		t.Errorf("removing an ignoreUpdates Secret changed the digest")
	}
	// A watched Secret's content counts.
	data["watched"]["v"] = "a: 2\n"
	d1 := digest(nil)
	if d1 == d0 {
		t.Errorf("a change of a watched Secret left the digest")
	}
	// So does a HelmChartConfig, and spec.set.
	d2 := digest(obj("HelmChartConfig", "app", map[string]any{"values": map[string]any{"a": int64(3)}}))
	if d2 == d1 {
		t.Errorf("a HelmChartConfig left the digest")
	}
	_ = unstructured.SetNestedField(hc.Object, map[string]any{"a": "4"}, "spec", "set")
	if d := digest(nil); d == d1 || d == d2 {
		t.Errorf("spec.set left the digest")
	}
}

// readValues stands in for helm's chartutil.ReadValues, which k3sm no
// longer links: the values, and so status.valuesDigest of releases already
// deployed, must not change.
func TestReadValuesIsHelms(t *testing.T) {
	for _, doc := range []string{"", "a: 1\nb: [x, 2.5, {c: true}]\nd: {e: null}\n", "# only a comment\n", "big: 1000000\nneg: -3\ns: '007'\n", "- a list\n", "a: [\n"} {
		want, werr := chartutil.ReadValues([]byte(doc))
		got, gerr := readValues([]byte(doc))
		if (werr == nil) != (gerr == nil) || (werr == nil && !reflect.DeepEqual(got, map[string]any(want))) {
			t.Errorf("%q: got %#v, %v; helm reads %#v, %v", doc, got, gerr, want, werr)
		}
	}
}
