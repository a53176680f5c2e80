package nodeimage

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
)

func TestRepositoryMatchesCluster(t *testing.T) {
	if DefaultRepository != cluster.LocalNodeRepository {
		t.Fatalf("nodeimage.DefaultRepository %q != cluster.LocalNodeRepository %q: cluster create would not find the image", DefaultRepository, cluster.LocalNodeRepository)
	}
	if got := DefaultTag("v1.37.2"); got != "klimax/node:v1.37.2" {
		t.Fatal(got)
	}
}

// Every file renders with the data the build gives it, and every manifest
// is YAML naming our preloaded images with pull policy Never.
func TestFilesRender(t *testing.T) {
	data := map[string]string{"SandboxImage": "registry.k8s.io/pause:3.10.2", "CNIImage": CNIImage, "LocalPathImage": LocalPathImage}
	ents, err := files.ReadDir("files")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		out, err := renderFile(e.Name(), data)
		if err != nil {
			t.Errorf("%s: %v", e.Name(), err)
			continue
		}
		if strings.Contains(string(out), "{{") {
			t.Errorf("%s: unrendered template action", e.Name())
		}
	}
	for file, img := range map[string]string{"default-cni.yaml.tmpl": CNIImage, "default-storage.yaml.tmpl": LocalPathImage} {
		out, _ := renderFile(file, data)
		for _, doc := range strings.Split(string(out), "\n---\n") {
			var v map[string]any
			if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
				t.Errorf("%s: %v", file, err)
			}
		}
		if !strings.Contains(string(out), "image: "+img+"\n        imagePullPolicy: Never") {
			t.Errorf("%s does not run %s with imagePullPolicy Never", file, img)
		}
	}
	cfg, _ := renderFile("config.toml.tmpl", data)
	for _, want := range []string{`sandbox_image = "registry.k8s.io/pause:3.10.2"`, "SystemdCgroup = true", `config_path = "/etc/containerd/certs.d"`, "restrict_oom_score_adj = false", "version = 2"} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("config.toml lacks %s", want)
		}
	}
}

func TestWriteLayer(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "bin")
	os.WriteFile(src, []byte("ELF"), 0o755)
	dst := filepath.Join(dir, "layer.tar")
	err := writeLayer(dst, []tarEntry{
		{name: "usr/local/bin/x", mode: 0o755, src: src},
		{name: "etc/a/b.conf", mode: 0o644, data: []byte("b")},
		{name: "opt/cni/bin", link: "/usr/lib/cni"},
		{name: "etc/cni/net.d", dir: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(dst)
	defer f.Close()
	tr := tar.NewReader(f)
	got := map[string]*tar.Header{}
	var order []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
		order = append(order, h.Name)
	}
	for _, want := range []string{"etc/", "etc/a/", "etc/a/b.conf", "etc/cni/net.d/", "opt/", "opt/cni/", "opt/cni/bin", "usr/local/bin/x"} {
		if got[want] == nil {
			t.Errorf("layer lacks %s (has %v)", want, order)
		}
	}
	if h := got["opt/cni/bin"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/usr/lib/cni" {
		t.Errorf("symlink: %+v", h)
	}
	if h := got["usr/local/bin/x"]; h == nil || h.Size != 3 || h.Mode != 0o755 {
		t.Errorf("binary: %+v", h)
	}
	// parents come before children
	seen := map[string]bool{}
	for _, n := range order {
		parent := filepath.Dir(strings.TrimSuffix(n, "/"))
		if parent != "." && !seen[parent+"/"] {
			t.Errorf("%s comes before its directory %s/", n, parent)
		}
		seen[n] = true
	}
}

func TestBuildRefusesOtherVersion(t *testing.T) {
	if _, err := os.Stat("../../../go.mod"); err != nil {
		t.Skip("not in the source tree")
	}
	b := &builder{opts: Options{SourceDir: "../../..", KubernetesVersion: "v1.30.0"}, out: io.Discard}
	err := b.resolve(t.Context())
	if err == nil || !strings.Contains(err.Error(), "--kubernetes-version v1.30.0") || !strings.Contains(err.Error(), "use --kubernetes-version v1.") {
		t.Fatalf("want a refusal naming the flag and the version to use, got %v", err)
	}
}
