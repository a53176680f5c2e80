package sandbox

import (
	"reflect"
	"strings"
	"testing"
)

func TestSubordinateRange(t *testing.T) {
	const file = `# comment
other:100000:65536
k3sm:200000:1000
k3sm:300000:65536
1001:400000:70000
`
	for _, c := range []struct {
		name  string
		id    int
		start uint32
		ok    bool
	}{
		{"k3sm", 999, 300000, true}, // the first range large enough
		{"bob", 1001, 400000, true}, // by numeric id
		{"alice", 1002, 0, false},
	} {
		start, ok := SubordinateRange(strings.NewReader(file), c.name, c.id, PodIDs-1)
		if start != c.start || ok != c.ok {
			t.Errorf("%s/%d: %d %v, want %d %v", c.name, c.id, start, ok, c.start, c.ok)
		}
	}
}

func TestRootlessMaps(t *testing.T) {
	m := RootlessMaps(999, 300000)
	if want := []IDMap{{0, 999, 1}, {1, 300000, PodIDs - 1}}; !reflect.DeepEqual(m, want) {
		t.Fatalf("%v, want %v", m, want)
	}
	if got := strings.Join(mapArgs(m), " "); got != "0 999 1 1 300000 65535" {
		t.Errorf("newuidmap args %q", got)
	}
	if !Covers(m, 0) || !Covers(m, 65535) || Covers(m, 65536) {
		t.Error("a range covers 0…65535 only")
	}
	own := RootlessMaps(999, 0)
	if !ownOnly(own, 999) || ownOnly(m, 999) || Covers(own, 1000) {
		t.Errorf("without a range only the runtime's own id: %v", own)
	}
}
