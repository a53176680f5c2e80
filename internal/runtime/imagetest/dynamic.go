package imagetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

var lddPath = regexp.MustCompile(`(/\S+) \(0x`)

// DynamicImage packs the host's dynamically linked program bin (e.g.
// /bin/ls, from Debian's packages) with the shared libraries and the
// dynamic loader it needs, at the paths ldd names, as an image with its
// own libc: Entrypoint [bin].
func DynamicImage(bin string) (v1.Image, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	files := []string{bin}
	for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
		files = append(files, m[1])
	}
	sort.Strings(files)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Unix(1700000000, 0)
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var ds []string
	for d := range dirs {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	for _, d := range ds {
		tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(d, "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now})
	}
	for _, f := range files {
		data, err := os.ReadFile(f) // through symlinks: the file itself
		if err != nil {
			return nil, err
		}
		tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(f, "/"), Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data)), ModTime: now})
		tw.Write(data)
	}
	tw.Close()
	return oneLayerImage(buf.Bytes(), func(cf *v1.ConfigFile) {
		cf.OS, cf.Architecture = "linux", runtime.GOARCH
		cf.Config.Entrypoint = []string{bin}
	})
}
