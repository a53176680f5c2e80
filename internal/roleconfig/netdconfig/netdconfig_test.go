package netdconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "netd.json")
	os.WriteFile(good, []byte(`{"socket":"/d/run/netd.sock","stateFile":"/d/agent/netd-state.json","netnsDir":"/d/run/netns","allowedUID":1000}`), 0o600)
	cfg, err := Read([]string{"--config=" + good})
	if err != nil || cfg != (Config{Socket: "/d/run/netd.sock", StateFile: "/d/agent/netd-state.json", NetNSDir: "/d/run/netns", AllowedUID: 1000}) {
		t.Fatalf("%+v %v", cfg, err)
	}
	withKeys := filepath.Join(dir, "keys.json")
	os.WriteFile(withKeys, []byte(`{"socket":"/s","stateFile":"/f","netnsDir":"/n","allowedUID":1,"keyDir":"/d/agent/mesh-keys"}`), 0o600)
	if cfg, err := Read([]string{"--config=" + withKeys}); err != nil || cfg.KeyDir != "/d/agent/mesh-keys" {
		t.Fatalf("%+v %v", cfg, err)
	}
	typo := filepath.Join(dir, "typo.json")
	os.WriteFile(typo, []byte(`{"socket":"/s","allowedUser":0}`), 0o600)
	trailing := filepath.Join(dir, "trailing.json")
	os.WriteFile(trailing, []byte(`{"socket":"/s"} {}`), 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "k3sm-netd --config=<file>"},
		{[]string{"--config=" + good, "extra"}, "k3sm-netd --config=<file>"},
		{[]string{"--config=" + filepath.Join(dir, "missing.json")}, "no such file"},
		{[]string{"--config=" + typo}, `unknown field "allowedUser"`},
		{[]string{"--config=" + trailing}, "trailing data"},
	} {
		if _, err := Read(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Read(%v) = %v, want %q", tc.args, err, tc.want)
		}
	}
}
