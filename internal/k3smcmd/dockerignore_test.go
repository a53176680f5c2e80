package k3smcmd

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// buildFiles builds the Dockerfile (FROM scratch, so no runtime is needed)
// and lists the regular files of its layers, with the build's output.
func buildFiles(t *testing.T, ctxDir, dockerfile string) ([]string, string, error) {
	t.Helper()
	var out bytes.Buffer
	b := &builder{ctxDir: ctxDir, file: dockerfile, out: &out, args: map[string]string{}}
	img, err := b.build()
	if err != nil {
		return nil, out.String(), err
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				files = append(files, h.Name)
			}
		}
		rc.Close()
	}
	sort.Strings(files)
	return files, out.String(), nil
}

var ignoreContext = map[string]string{
	"Dockerfile": "FROM scratch\nCOPY . /ctx/\n",
	".dockerignore": `# secrets and build output stay out
secret.txt
/*.log
**/*.tmp
build
!build/keep.bin
Dockerfile
.dockerignore
`,
	"secret.txt":     "s3cret",
	"root.log":       "log",
	"app/main.txt":   "main",
	"app/debug.log":  "a log below the root: *.log at the root does not match it",
	"app/cache.tmp":  "tmp",
	"app/a/b/c.tmp":  "tmp",
	"build/out.o":    "obj",
	"build/keep.bin": "kept by the exception",
}

// COPY . leaves out what .dockerignore names, as Docker: root-anchored
// patterns, **, a directory and all below it, ! exceptions, and the
// Dockerfile and .dockerignore themselves (still read by the build).
func TestBuildHonoursDockerignore(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, ignoreContext)
	files, out, err := buildFiles(t, dir, filepath.Join(dir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ctx/app/debug.log", "ctx/app/main.txt", "ctx/build/keep.bin"}
	if strings.Join(files, " ") != strings.Join(want, " ") {
		t.Fatalf("layer files %v, want %v", files, want)
	}
	if !strings.Contains(out, ".dockerignore: 7 patterns leave files out") {
		t.Errorf("the build does not say it reads .dockerignore:\n%s", out)
	}

	// Without the file everything goes in, the Dockerfile too.
	if err := os.Remove(filepath.Join(dir, ".dockerignore")); err != nil {
		t.Fatal(err)
	}
	files, _, err = buildFiles(t, dir, filepath.Join(dir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(ignoreContext)-1 {
		t.Fatalf("without .dockerignore: %v", files)
	}
}

// A source that is excluded is an error naming the ignore file, as it is
// not in Docker's context either; a COPY of an excluded directory still
// takes what an exception brings back.
func TestBuildExcludedSource(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, ignoreContext)
	df := filepath.Join(dir, "Dockerfile")
	os.WriteFile(df, []byte("FROM scratch\nCOPY secret.txt /etc/secret\n"), 0o644)
	_, _, err := buildFiles(t, dir, df)
	if err == nil || !strings.Contains(err.Error(), "Dockerfile:2: source secret.txt: excluded from the build context by "+filepath.Join(dir, ".dockerignore")) {
		t.Fatalf("COPY of an ignored file: %v", err)
	}
	os.WriteFile(df, []byte("FROM scratch\nCOPY app/*.txt build /out/\n"), 0o644)
	files, _, err := buildFiles(t, dir, df)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(files, " ") != "out/keep.bin out/main.txt" {
		t.Fatalf("glob and excluded directory: %v", files)
	}
}

// <Dockerfile>.dockerignore next to the Dockerfile wins over the context's
// .dockerignore, as BuildKit.
func TestBuildDockerfileSpecificIgnore(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, ignoreContext)
	df := filepath.Join(t.TempDir(), "app.Dockerfile")
	os.WriteFile(df, []byte("FROM scratch\nCOPY . /ctx/\n"), 0o644)
	os.WriteFile(df+".dockerignore", []byte("app\nbuild\n*.log\n.dockerignore\n"), 0o644)
	files, out, err := buildFiles(t, dir, df)
	if err != nil {
		t.Fatal(err)
	}
	if want := "ctx/Dockerfile ctx/secret.txt"; strings.Join(files, " ") != want {
		t.Fatalf("layer files %v, want %s", files, want)
	}
	if !strings.Contains(out, "app.Dockerfile.dockerignore: 4 patterns") {
		t.Errorf("output:\n%s", out)
	}
}

func TestBadDockerignorePattern(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"Dockerfile": "FROM scratch\nCOPY . /\n", ".dockerignore": "[\n"})
	_, _, err := buildFiles(t, dir, filepath.Join(dir, "Dockerfile"))
	if err == nil || !strings.Contains(err.Error(), ".dockerignore") || !strings.Contains(err.Error(), "fix or remove the line") {
		t.Fatalf("bad pattern: %v", err)
	}
}
