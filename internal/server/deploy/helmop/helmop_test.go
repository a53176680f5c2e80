package helmop

import (
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmwire"
)

// spec.set wins over the merged layers, as helm's --set, strings as
// --set-string; a malformed key names its field.
func TestSetOverValues(t *testing.T) {
	req := &helmwire.Request{
		Values: helmwire.Values{"who": "layers", "nested": map[string]any{"x": "layers", "z": "layers"}, "keep": 1.5},
		Set:    helmwire.Values{"who": "set", "nested.x": "set", "flag": "true", "n": int64(3), "b": true},
	}
	vals, err := values(req)
	if err != nil {
		t.Fatal(err)
	}
	nested := vals["nested"].(map[string]any)
	if vals["who"] != "set" || nested["x"] != "set" || nested["z"] != "layers" || vals["keep"] != 1.5 {
		t.Errorf("spec.set did not win key by key: %v", vals)
	}
	if vals["flag"] != "true" {
		t.Errorf("a string of spec.set is --set-string: flag = %#v", vals["flag"])
	}
	if vals["n"] != int64(3) || vals["b"] != true {
		t.Errorf("other values of spec.set are --set: n = %#v, b = %#v", vals["n"], vals["b"])
	}
	req.Set = helmwire.Values{"a[=": int64(1)}
	if _, err := values(req); err == nil || !strings.Contains(err.Error(), "spec.set.a[=") {
		t.Errorf("a malformed key: %v", err)
	}
}

func TestSameValuesComparesAsJSON(t *testing.T) {
	if !sameValues(map[string]any{"n": int64(1), "m": map[string]any{"f": 1.5}}, map[string]any{"n": float64(1), "m": map[string]any{"f": 1.5}}) {
		t.Error("int64 1 and float64 1 differ")
	}
	if !sameValues(nil, map[string]any{}) {
		t.Error("no values and empty values differ")
	}
	if sameValues(map[string]any{"a": "1"}, map[string]any{"a": "2"}) {
		t.Error("different values are the same")
	}
}
