package deploy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestParseMultiDocument(t *testing.T) {
	data := []byte(`# leading comment
apiVersion: v1
kind: ConfigMap
metadata: {name: a}
---
# only a comment
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}
- {apiVersion: v1, kind: Secret, metadata: {name: c, namespace: x}}
--- # a trailing separator with a comment
`)
	objs, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind()+"/"+o.GetName())
	}
	if want := []string{"ConfigMap/a", "ConfigMap/b", "Secret/c"}; !slices.Equal(got, want) {
		t.Fatalf("objects %v, want %v", got, want)
	}
}

func TestParseJSON(t *testing.T) {
	objs, err := Parse([]byte(`{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}`))
	if err != nil || len(objs) != 1 || objs[0].GetName() != "n" {
		t.Fatalf("objs %v, err %v", objs, err)
	}
}

// The line of an error is counted in the whole file, not the document.
func TestParseErrorLine(t *testing.T) {
	for _, tc := range []struct {
		data string
		line int
	}{
		{"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n   bad: indent\n", 9},
		{"apiVersion: v1\nkind: ConfigMap\n---\nkind: ConfigMap\nmetadata: {name: a}\n", 1},
		{"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n- a list\n", 5},
		{"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {generateName: a-}\n", 5},
	} {
		_, err := Parse([]byte(tc.data))
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Errorf("%q: error %v, want a ParseError", tc.data, err)
			continue
		}
		if pe.Line != tc.line {
			t.Errorf("%q: line %d (%v), want %d", tc.data, pe.Line, err, tc.line)
		}
	}
}

func TestOrderPutsNamespacesAndCRDsFirst(t *testing.T) {
	objs, err := Parse([]byte(`apiVersion: example.com/v1
kind: Widget
metadata: {name: w}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
---
apiVersion: v1
kind: Namespace
metadata: {name: ns1}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range order(objs) {
		got = append(got, o.GetKind())
	}
	if want := []string{"Namespace", "CustomResourceDefinition", "Widget"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestManifestsSkipAndExtensions(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"a.yaml", "b.yml", "c.json", "d.txt", "e.yaml", "e.yaml.skip", ".hidden.yaml", "sub/f.yaml"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	apply, skipped, err := Manifests(dir)
	if err != nil {
		t.Fatal(err)
	}
	rel := func(ps []string) (out []string) {
		for _, p := range ps {
			r, _ := filepath.Rel(dir, p)
			out = append(out, r)
		}
		return out
	}
	if want := []string{"a.yaml", "b.yml", "c.json", "sub/f.yaml"}; !slices.Equal(rel(apply), want) {
		t.Errorf("applied %v, want %v", rel(apply), want)
	}
	if want := []string{"e.yaml"}; !slices.Equal(rel(skipped), want) {
		t.Errorf("skipped %v, want %v", rel(skipped), want)
	}
	if a, s, err := Manifests(filepath.Join(dir, "missing")); err != nil || len(a)+len(s) != 0 {
		t.Errorf("missing folder: %v %v %v", a, s, err)
	}
}
