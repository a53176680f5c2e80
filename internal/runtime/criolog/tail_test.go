package criolog

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// Tail gives the last lines of a log, cut to a byte budget, as a failed
// container's termination message is taken from its log.
func TestTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	if got, err := Tail(path, 80, 2048); err != nil || got != "" {
		t.Fatalf("a missing log: %q, %v", got, err)
	}
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	var in strings.Builder
	for i := range 100 {
		fmt.Fprintf(&in, "line %d\n", i)
	}
	in.WriteString("DONE") // echo -n: Copy ends it as a record of its own
	if err := w.Copy(Stdout, strings.NewReader(in.String())); err != nil {
		t.Fatal(err)
	}
	w.Close()
	got, err := Tail(path, 3, 2048)
	if err != nil {
		t.Fatal(err)
	}
	if want := "line 98\nline 99\nDONE\n"; got != want {
		t.Errorf("Tail 3 lines = %q", got)
	}
	if got, _ := Tail(path, 80, 10); len(got) != 10 || !strings.HasSuffix(got, "\n") {
		t.Errorf("Tail cut to 10 bytes = %q", got)
	}
}
