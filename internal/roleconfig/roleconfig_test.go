package roleconfig

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/roleconfig/netdconfig"
)

// What the server writes is what the child reads, field for field.
func TestWriteReadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.json")
	want := NodeConfig{Name: "n", IP: "10.0.0.1", KubeletPort: 10250, Kubeconfig: "/k", DataDir: "/d", Instant: true, Taint: true,
		Metrics: MetricsAPI{Addr: "127.0.0.1:1", AllowedNames: []string{"system:auth-proxy"}, Resolution: 15 * time.Second,
			ScrapeCertFile: "/s.crt", ScrapeKeyFile: "/s.key", KubeletCAFile: "/ca.crt"},
		Disk: diskpolicy.Default()}
	args, err := Write(path, want)
	if err != nil || !reflect.DeepEqual(args, []string{"--config=" + path}) {
		t.Fatalf("%v %v", args, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", fi.Mode(), err)
	}
	var got NodeConfig
	if err := Read(Node, args, &got); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("read %+v %v", got, err)
	}
}

func TestReadRefuses(t *testing.T) {
	dir := t.TempDir()
	unknown := filepath.Join(dir, "unknown.json")
	os.WriteFile(unknown, []byte(`{"name":"n","nodeNmae":"typo"}`), 0o600)
	var cfg NodeConfig
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "k3sm node --config=<file>"},
		{[]string{"--config=" + filepath.Join(dir, "missing.json")}, "no such file"},
		{[]string{"--config=" + unknown}, `unknown field "nodeNmae"`},
		{[]string{"--node-name=n"}, "flag provided but not defined"},
	} {
		if err := Read(Node, tc.args, &cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Read(%v) = %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}

// What the server writes for k3sm-netd is what netd reads.
func TestNetdConfigRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "netd.json")
	want := NetdConfig{Socket: "/d/run/netd.sock", StateFile: "/d/agent/netd-state.json", NetNSDir: "/d/run/netns", AllowedUID: 1000}
	args, err := Write(path, want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := netdconfig.Read(args)
	if err != nil || got != want {
		t.Fatalf("%+v %v", got, err)
	}
	data, _ := os.ReadFile(path)
	for _, key := range []string{`"socket"`, `"stateFile"`, `"netnsDir"`, `"allowedUID"`} {
		if !strings.Contains(string(data), key) {
			t.Errorf("%s lacks %s", data, key)
		}
	}
}

func TestSplitKine(t *testing.T) {
	path, rest := SplitKine([]string{KineFlag + "/d/run/kine.json", "--secure-port=6443"})
	if path != "/d/run/kine.json" || len(rest) != 1 || rest[0] != "--secure-port=6443" {
		t.Errorf("got %q %q", path, rest)
	}
	// Only as the first argument: an upstream flag is never taken for it.
	path, rest = SplitKine([]string{"--secure-port=6443", KineFlag + "/x"})
	if path != "" || len(rest) != 2 {
		t.Errorf("got %q %q", path, rest)
	}
	if path, rest := SplitKine(nil); path != "" || len(rest) != 0 {
		t.Errorf("got %q %q", path, rest)
	}
}
