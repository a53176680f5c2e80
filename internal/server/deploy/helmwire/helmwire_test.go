package helmwire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// Values keep int64 and float64 apart across the wire (templates render
// float64 1000000 as 1e+06), and every other kind of value as it was.
func TestValuesKeepNumberTypes(t *testing.T) {
	in := Values{
		"int": int64(1000000), "float": float64(1000000), "frac": 2.5, "tiny": 1e-9, "huge": 1e300, "neg": int64(-7),
		"s": "1", "b": false, "null": nil,
		"list":   []any{int64(1), 1.0, "x", nil, map[string]any{"f": 3.0}},
		"nested": map[string]any{"i": int64(2), "f": 2.0, "deeper": map[string]any{"k": []any{}}},
	}
	b, err := json.Marshal(&Request{Op: OpDeploy, Values: in, Set: Values{"a.b": int64(3), "c": 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	var out Request
	if err := Decode(bytes.NewReader(b), &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out.Values, in) {
		t.Errorf("values changed on the wire:\n%#v\n%#v\n(%s)", in, out.Values, b)
	}
	if !reflect.DeepEqual(out.Set, Values{"a.b": int64(3), "c": 0.5}) {
		t.Errorf("set changed on the wire: %#v", out.Set)
	}
}

// A request from another build (a field this one does not know) is refused.
func TestDecodeRefusesUnknownFields(t *testing.T) {
	var r Request
	err := Decode(strings.NewReader(`{"op":"deploy","release":"x","wait":true}`), &r)
	if err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("got %v", err)
	}
	if err := Decode(strings.NewReader(`{"op":"deploy"} {}`), &r); err == nil {
		t.Error("trailing data accepted")
	}
}
