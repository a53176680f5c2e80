//go:build linux

package main

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const sampleManifest = `
type RegistryList struct {
	PromoterE2eRegistry      string ` + "`yaml:\"promoterE2eRegistry\"`" + `
	InvalidRegistry          string ` + "`yaml:\"invalidRegistry\"`" + `
	GcRegistry               string ` + "`yaml:\"gcRegistry\"`" + `
	PrivateRegistry          string ` + "`yaml:\"privateRegistry\"`" + `
	DockerLibraryRegistry    string ` + "`yaml:\"dockerLibraryRegistry\"`" + `
}

var (
	initRegistry = RegistryList{
		PromoterE2eRegistry:      "registry.k8s.io/e2e-test-images",
		InvalidRegistry:          "invalid.registry.k8s.io/invalid",
		GcRegistry:               "registry.k8s.io",
		PrivateRegistry:          "gcr.io/k8s-authenticated-test",
		DockerLibraryRegistry:    "docker.io/library",
	}
)

func initImageConfigs(list RegistryList) (map[ImageID]Config, map[ImageID]Config) {
	configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.66.1"}
	configs[Pause] = Config{list.GcRegistry, "pause", "3.10.2"}
	configs[VolumeNFSServer] = Config{list.PromoterE2eRegistry, "volume/nfs", "1.6.0"}
}
`

func TestParseManifest(t *testing.T) {
	m, err := parseManifest(sampleManifest)
	if err != nil {
		t.Fatal(err)
	}
	host := "127.0.0.1:5000"
	if got := m.ref(host, m.images["Agnhost"]); got != "127.0.0.1:5000/e2e-test-images/agnhost:2.66.1" {
		t.Errorf("agnhost ref %s", got)
	}
	if got := m.ref(host, m.images["Pause"]); got != "127.0.0.1:5000/pause:3.10.2" {
		t.Errorf("pause ref %s", got)
	}
	if got := m.upstreamRef(m.images["Pause"]); got != "registry.k8s.io/pause:3.10.2" {
		t.Errorf("pause upstream %s", got)
	}
	want := `promoterE2eRegistry: "127.0.0.1:5000/e2e-test-images"
invalidRegistry: "invalid.registry.k8s.io/invalid"
gcRegistry: "127.0.0.1:5000"
privateRegistry: "gcr.io/k8s-authenticated-test"
dockerLibraryRegistry: "127.0.0.1:5000/library"
`
	if got := m.repoListYAML(host); !strings.HasSuffix(got, want) {
		t.Errorf("repo list:\n%s\nwant suffix:\n%s", got, want)
	}
	if got := fileName(m.ref(host, m.images["VolumeNFSServer"])); got != "e2e-test-images_volume_nfs_1.6.0.tar" {
		t.Errorf("file name %s", got)
	}
}

// TestUpstreamManifest checks the recipes against the pinned manifest.go
// when the module cache has it.
func TestUpstreamManifest(t *testing.T) {
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, "go", "pkg", "mod")
	}
	p := filepath.Join(cache, "k8s.io", "kubernetes@v1.37.2", "test", "utils", "image", "manifest.go")
	if _, err := os.Stat(p); err != nil {
		t.Skip("k8s.io/kubernetes@v1.37.2 is not in the module cache")
	}
	m, err := parseManifestFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b := &builder{man: m, k8sVersion: "v1.37.2"}
	if _, _, err := b.plan(); err != nil {
		t.Fatal(err)
	}
	if len(m.fields) != 9 {
		t.Errorf("registry fields %v", m.fields)
	}
	for id, want := range map[string]string{
		"Agnhost":     "h/e2e-test-images/agnhost:2.66.1",
		"AgnhostPrev": "h/e2e-test-images/agnhost:2.55",
		"Etcd":        "h/etcd:3.7.0-0",
		"APIServer":   "h/e2e-test-images/sample-apiserver:1.29.2",
	} {
		if got := m.ref("h", m.images[id]); got != want {
			t.Errorf("%s: %s, want %s", id, got, want)
		}
	}
}

func TestWriteTree(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "dev", "x"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr", "bin", "su"), []byte("su"), 0o755))
	must(syscall.Chmod(filepath.Join(root, "usr", "bin", "su"), 0o4755))
	must(os.Link(filepath.Join(root, "usr", "bin", "su"), filepath.Join(root, "usr", "bin", "su2")))
	must(os.Symlink("usr/bin", filepath.Join(root, "bin")))
	must(os.Mkdir(filepath.Join(root, "tmp"), 0o755))
	must(syscall.Chmod(filepath.Join(root, "tmp"), 0o1777))
	must(os.WriteFile(filepath.Join(root, "dev", "x", "null"), nil, 0o644))

	p := filepath.Join(t.TempDir(), "l.tar.gz")
	must(createLayer(p, func(tw *tar.Writer) error {
		return writeTree(tw, root, map[string]bool{"dev": true})
	}))
	hdrs := readLayer(t, p)
	if h := hdrs["usr/bin/su"]; h == nil || h.Mode != 0o4755 || h.Typeflag != tar.TypeReg {
		t.Errorf("su: %+v", h)
	}
	if h := hdrs["usr/bin/su2"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "usr/bin/su" {
		t.Errorf("su2: %+v", h)
	}
	if h := hdrs["bin"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/bin" {
		t.Errorf("bin: %+v", h)
	}
	if h := hdrs["tmp/"]; h == nil || h.Mode != 0o1777 {
		t.Errorf("tmp: %+v", h)
	}
	if hdrs["dev/"] == nil || hdrs["dev/x/"] != nil || hdrs["dev/x/null"] != nil {
		t.Errorf("dev contents kept: %v", hdrs)
	}
	if got, err := rootfsFile(root, "/bin/su"); err != nil || got != filepath.Join(root, "usr/bin/su") {
		t.Errorf("rootfsFile /bin/su = %s, %v", got, err)
	}
}

func readLayer(t *testing.T, p string) map[string]*tar.Header {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

func TestInstallAndUpToDate(t *testing.T) {
	src, out := t.TempDir(), t.TempDir()
	for _, n := range []string{"a.tar", "images.txt", "repo-list.yaml"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(out, "stale.tar"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, stampName), []byte("key old\nfile stale.tar 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := upToDate(out, "k1"); ok {
		t.Fatal("up to date before install")
	}
	if err := install(src, out, "k1"); err != nil {
		t.Fatal(err)
	}
	if files, ok := upToDate(out, "k1"); !ok || len(files) != 3 {
		t.Fatalf("not up to date after install: %v", files)
	}
	if _, err := os.Stat(filepath.Join(out, "stale.tar")); !os.IsNotExist(err) {
		t.Error("stale file of the old build kept")
	}
	if _, ok := upToDate(out, "k2"); ok {
		t.Error("up to date for another key")
	}
	os.Remove(filepath.Join(out, "a.tar"))
	if _, ok := upToDate(out, "k1"); ok {
		t.Error("up to date with a file missing")
	}
}

func TestSetConfig(t *testing.T) {
	in := "# CONFIG_STATIC is not set\nCONFIG_TC=y\nCONFIG_FEATURE_TC_INGRESS=y\n"
	got, err := setConfig(in, map[string]bool{"CONFIG_STATIC": true, "CONFIG_TC": false})
	if err != nil {
		t.Fatal(err)
	}
	if want := "CONFIG_STATIC=y\n# CONFIG_TC is not set\nCONFIG_FEATURE_TC_INGRESS=y\n"; got != want {
		t.Errorf("setConfig = %q, want %q", got, want)
	}
	if again, _ := setConfig(got, map[string]bool{"CONFIG_STATIC": true, "CONFIG_TC": false}); again != got {
		t.Errorf("setConfig is not idempotent: %q", again)
	}
	if _, err := setConfig(in, map[string]bool{"CONFIG_NOPE": true}); err == nil {
		t.Error("no error for a missing option")
	}
}
