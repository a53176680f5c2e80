package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestSpecFile(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--root", "/run/runc", "--log", "/l", "create", "--bundle", "/b", "id"}, "/b/config.json"},
		{[]string{"run", "--bundle=/c", "id"}, "/c/config.json"},
		{[]string{"--root", "/r", "exec", "--process", "/tmp/p.json", "--detach", "id"}, "/tmp/p.json"},
		{[]string{"--root", "/r", "start", "id"}, ""},
		{[]string{"--root", "/r", "delete", "--force", "id"}, ""},
	} {
		if got := specFile(tc.args); got != tc.want {
			t.Errorf("specFile(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

func TestFilter(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(p, []byte(`{"ociVersion":"1.0.2","process":{"args":["sh"],"capabilities":{"bounding":["CAP_CHOWN","CAP_SYS_RESOURCE"],"effective":["CAP_SYS_RESOURCE","CAP_KILL"]}},"root":{"path":"rootfs"}}`), 0o600)
	if err := filter(p, map[string]bool{"CAP_SYS_RESOURCE": true}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Process struct {
			Args         []string
			Capabilities map[string][]string
		}
		Root struct{ Path string }
	}
	data, _ := os.ReadFile(p)
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if got := doc.Process.Capabilities; len(got["bounding"]) != 1 || got["bounding"][0] != "CAP_CHOWN" || len(got["effective"]) != 1 || got["effective"][0] != "CAP_KILL" {
		t.Fatalf("capabilities after filter: %v", got)
	}
	if doc.Root.Path != "rootfs" || len(doc.Process.Args) != 1 {
		t.Fatalf("other fields changed: %s", data)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode changed to %v", st.Mode())
	}
}
