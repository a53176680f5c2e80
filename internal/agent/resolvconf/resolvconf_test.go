package resolvconf

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	f, err := Parse(strings.NewReader("# host\n; also a comment\nnameserver 127.0.0.53\nnameserver 192.0.2.53 # inline\nnameserver\n" +
		"domain old.example\nsearch corp.example lab.example\noptions edns0 trust-ad\noptions ndots:2\n#nameserver 192.0.2.99\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"127.0.0.53", "192.0.2.53"}; !slices.Equal(f.Nameservers, want) {
		t.Errorf("nameservers %q, want %q", f.Nameservers, want)
	}
	if want := []string{"corp.example", "lab.example"}; !slices.Equal(f.Search, want) {
		t.Errorf("search %q, want %q (the last search or domain line)", f.Search, want)
	}
	if want := []string{"edns0", "trust-ad", "ndots:2"}; !slices.Equal(f.Options, want) {
		t.Errorf("options %q, want %q (as written)", f.Options, want)
	}
}

func TestRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte("nameserver 192.0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err := Read(p); err != nil || !slices.Equal(f.Nameservers, []string{"192.0.2.1"}) {
		t.Errorf("%+v %v", f, err)
	}
	if _, err := Read(filepath.Join(t.TempDir(), "missing")); !os.IsNotExist(err) {
		t.Errorf("missing file: %v", err)
	}
}
