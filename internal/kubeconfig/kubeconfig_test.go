package kubeconfig

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	goldenfile "github.com/k3sm-dev/k3sm/internal/golden"

	"k8s.io/client-go/tools/clientcmd"
)

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenfile.Check(t, name+".golden", got)
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func setup(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), ".kube", "config")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, read(t, "testdata/existing.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, read(t, "testdata/kind-dev.yaml")
}

func TestRewriteServerGolden(t *testing.T) {
	out, err := RewriteServer(read(t, "testdata/kind-dev.yaml"), "https://192.168.64.3:7001")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "rewrite", out)
	if s, _ := Server(out, "kind-dev"); s != "https://192.168.64.3:7001" {
		t.Errorf("server = %q", s)
	}
	if _, err := RewriteServer([]byte("apiVersion: v1\nkind: Config\n"), "https://x"); err == nil {
		t.Error("rewrite of kubeconfig without clusters accepted")
	}
}

func TestMergeGoldenKeepsUnknownAndBacksUp(t *testing.T) {
	path, kind := setup(t)
	orig := read(t, path)
	backup, err := Merge(path, kind, MergeOptions{SetCurrentContext: true})
	if err != nil {
		t.Fatal(err)
	}
	got := read(t, path)
	golden(t, "merged", got)
	for _, keep := range []string{"x-tool-setting", "keep: me", "interactiveMode: Never", "audience: prod", "namespace: payments", "colors: true", "# my kubeconfig", "current-context: kind-dev"} {
		if !strings.Contains(string(got), keep) {
			t.Errorf("merged file lost %q", keep)
		}
	}
	if backup != BackupPath(path) || !bytes.Equal(read(t, backup), orig) {
		t.Errorf("backup %q does not hold the old file", backup)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	// Merging the same thing again changes nothing and makes no new backup.
	os.Remove(backup)
	if b, err := Merge(path, kind, MergeOptions{SetCurrentContext: true}); err != nil || b != "" {
		t.Errorf("second merge: backup %q err %v", b, err)
	}
	if !bytes.Equal(read(t, path), got) {
		t.Error("second merge changed the file")
	}
}

func TestMergeThenRemoveRoundTrip(t *testing.T) {
	path, kind := setup(t)
	// Normalise the starting file to our encoder's layout so bytes compare.
	if _, err := Merge(path, kind, MergeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Remove(path, []string{"kind-dev"}); err != nil {
		t.Fatal(err)
	}
	base := read(t, path)
	if strings.Contains(string(base), "kind-dev") {
		t.Fatalf("remove left kind-dev behind:\n%s", base)
	}
	if _, err := Merge(path, kind, MergeOptions{SetCurrentContext: true}); err != nil {
		t.Fatal(err)
	}
	if err := Remove(path, []string{"kind-dev"}); err != nil {
		t.Fatal(err)
	}
	got := read(t, path)
	// current-context pointed at kind-dev, so it is cleared; everything else is identical.
	want := strings.Replace(string(base), "current-context: prod", `current-context: ""`, 1)
	if string(got) != want {
		t.Errorf("round trip differs:\n--- got\n%s\n--- want\n%s", got, want)
	}
	golden(t, "removed", got)
}

func TestRemoveKeepsSharedClusterAndUser(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config")
	kc := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:7001"}
users:
- name: u
  user: {token: t}
contexts:
- name: a
  context: {cluster: c, user: u}
- name: b
  context: {cluster: c, user: u}
current-context: b
`
	if _, err := Merge(path, []byte(kc), MergeOptions{SetCurrentContext: true}); err != nil {
		t.Fatal(err)
	}
	if err := Remove(path, []string{"a", "not-there"}); err != nil {
		t.Fatal(err)
	}
	got := string(read(t, path))
	if strings.Contains(got, "name: a\n") || !strings.Contains(got, "name: c") || !strings.Contains(got, "name: u") || !strings.Contains(got, "current-context: b") {
		t.Errorf("after removing a:\n%s", got)
	}
	if err := Remove(path, []string{"b"}); err != nil {
		t.Fatal(err)
	}
	got = string(read(t, path))
	if strings.Contains(got, "name: c") || strings.Contains(got, "name: u") || !strings.Contains(got, "clusters: []") {
		t.Errorf("after removing b:\n%s", got)
	}
	if err := Remove(filepath.Join(t.TempDir(), "missing"), []string{"x"}); err != nil {
		t.Errorf("remove on missing file: %v", err)
	}
}

func TestMergeIntoMissingAndEmptyFile(t *testing.T) {
	kind := read(t, "testdata/kind-dev.yaml")
	for _, initial := range []*string{nil, new(string)} {
		path := filepath.Join(t.TempDir(), "sub", "config")
		if initial != nil {
			os.MkdirAll(filepath.Dir(path), 0o700)
			os.WriteFile(path, []byte(*initial), 0o600)
		}
		if _, err := Merge(path, kind, MergeOptions{}); err != nil {
			t.Fatal(err)
		}
		got := read(t, path)
		names, err := ContextNames(got)
		if err != nil || len(names) != 1 || names[0] != "kind-dev" {
			t.Errorf("contexts %v err %v in\n%s", names, err, got)
		}
		if !strings.Contains(string(got), `current-context: ""`) {
			t.Errorf("current-context set without SetCurrentContext:\n%s", got)
		}
	}
}

func TestBadInputLosesNothing(t *testing.T) {
	path, kind := setup(t)
	orig := read(t, path)
	bad := map[string]string{
		"not yaml":       "{{{",
		"dangling ref":   "apiVersion: v1\nkind: Config\ncontexts:\n- name: x\n  context: {cluster: nope, user: nope}\n",
		"no contexts":    "apiVersion: v1\nkind: Config\n",
		"duplicate name": "clusters:\n- name: a\n  cluster: {}\n- name: a\n  cluster: {}\n",
		"list not list":  "clusters: {a: b}\n",
	}
	for name, doc := range bad {
		if _, err := Merge(path, []byte(doc), MergeOptions{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if !bytes.Equal(read(t, path), orig) {
		t.Error("file changed by rejected merges")
	}
	os.WriteFile(path, []byte("clusters: [unclosed"), 0o600)
	if _, err := Merge(path, kind, MergeOptions{}); err == nil || !strings.Contains(err.Error(), "not changed") {
		t.Errorf("merge into broken file: %v", err)
	}
	if string(read(t, path)) != "clusters: [unclosed" {
		t.Error("broken file was overwritten")
	}
}

func TestUseContext(t *testing.T) {
	path, kind := setup(t)
	if _, err := Merge(path, kind, MergeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := UseContext(path, "kind-dev"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(read(t, path)), "current-context: kind-dev") {
		t.Error("current-context not set")
	}
	if err := UseContext(path, "nope"); err == nil {
		t.Error("unknown context accepted")
	}
}

func TestConcurrentMerges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config")
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			n := fmt.Sprintf("kind-c%d", i)
			kc := fmt.Sprintf("clusters:\n- name: %s\n  cluster: {server: 'https://127.0.0.1:%d'}\nusers:\n- name: %s\n  user: {token: t}\ncontexts:\n- name: %s\n  context: {cluster: %s, user: %s}\n", n, 7000+i, n, n, n, n)
			_, err := Merge(path, []byte(kc), MergeOptions{})
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	names, err := ContextNames(read(t, path))
	if err != nil || len(names) != 20 {
		t.Errorf("got %d contexts (%v), want 20", len(names), err)
	}
}

// TestMergedFileLoadsWithClientGo checks that what Merge writes is a valid
// kubeconfig for client-go (what kubectl uses), with both contexts usable.
func TestMergedFileLoadsWithClientGo(t *testing.T) {
	path, kind := setup(t)
	if _, err := Merge(path, kind, MergeOptions{SetCurrentContext: true}); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CurrentContext != "kind-dev" || cfg.Contexts["prod"].Namespace != "payments" || cfg.Clusters["kind-dev"].Server != "https://0.0.0.0:7001" || cfg.AuthInfos["prod-admin"].Exec == nil {
		t.Errorf("client-go view: %+v", cfg)
	}
	if _, err := clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig(); err != nil {
		t.Errorf("client config for kind-dev: %v", err)
	}
}
