package imagetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/k3sm-dev/k3sm/internal/backoff"
	"github.com/k3sm-dev/k3sm/internal/tartree"
)

// nginxPackages are Debian's nginx and everything its binary loads: with
// nothing of the host's in it, the image is what a stock nginx image is.
var nginxPackages = []string{"nginx", "nginx-common", "libc6", "libcrypt1", "libpcre2-8-0", "libssl3", "zlib1g"}

// NginxIndex is the page NginxImage serves at /.
const NginxIndex = "served by Debian's nginx\n"

// NginxImage is Debian's nginx package, unpacked with its libraries as the
// image's root, configured as its maintainer scripts leave it (the default
// site on port 80, workers as www-data) plus NginxIndex as the page: the
// master must bind port 80 as the pod's root, as in every stock web-server
// image. Entrypoint: nginx -g "daemon off;". The packages are downloaded
// once per machine into DebCacheDir.
func NginxImage() (v1.Image, error) {
	debs, err := debianPackages(nginxPackages)
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "nginx-root-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	for _, deb := range debs {
		if out, err := exec.Command("dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("dpkg-deb -x %s: %v: %s", deb, err, out)
		}
	}
	// What base-passwd, base-files and nginx's postinst would have made.
	files := map[string]string{
		"etc/passwd":               "root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\n",
		"etc/group":                "root:x:0:\nwww-data:x:33:\n",
		"var/www/html/index.html":  NginxIndex,
		"etc/nginx/sites-enabled/": "",
		"run/":                     "",
		"tmp/":                     "",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if strings.HasSuffix(name, "/") {
			err = os.MkdirAll(p, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := os.Symlink("/etc/nginx/sites-available/default", filepath.Join(root, "etc/nginx/sites-enabled/default")); err != nil {
		return nil, err
	}
	layer, err := tarTree(root)
	if err != nil {
		return nil, err
	}
	return oneLayerImage(layer, func(cf *v1.ConfigFile) {
		cf.OS, cf.Architecture = "linux", runtime.GOARCH
		cf.Config.Entrypoint = []string{"/usr/sbin/nginx", "-g", "daemon off;"}
		cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	})
}

// FetchNginxPackages downloads what NginxImage is made of into
// DebCacheDir, for a test process about to enter a network namespace
// without a route to Debian's mirror (test/e2e's TestMain).
func FetchNginxPackages() error {
	_, err := debianPackages(nginxPackages)
	return err
}

// DebCacheDir is where Debian packages for test images are kept between
// runs: $K3SM_TEST_DEB_CACHE, or k3sm-test/debs in the user's cache dir.
func DebCacheDir() (string, error) {
	if d := os.Getenv("K3SM_TEST_DEB_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "k3sm-test", "debs"), nil
}

// debianPackages returns the .deb files of pkgs (the host's architecture),
// downloading with apt-get those not in DebCacheDir yet. A failed download
// is tried again with a back-off (a mirror's hiccup must not fail a test
// run), the first time after apt-get update when root, for a machine whose
// package lists are missing or out of date. Each attempt downloads into its
// own directory and renames the files into the cache, so concurrent test
// processes never see a half-written .deb.
func debianPackages(pkgs []string) ([]string, error) {
	dir, err := DebCacheDir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	find := func() (found []string, missing []string) {
		for _, p := range pkgs {
			m, _ := filepath.Glob(filepath.Join(dir, p+"_*.deb"))
			if len(m) == 0 {
				missing = append(missing, p)
				continue
			}
			found = append(found, m[len(m)-1])
		}
		return found, missing
	}
	download := func(missing []string) error {
		tmp, err := os.MkdirTemp(dir, ".download-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		cmd := exec.Command("apt-get", append([]string{"download", "-q"}, missing...)...)
		cmd.Dir = tmp
		out, err := cmd.CombinedOutput()
		// Keep what did arrive: the next attempt fetches only the rest.
		debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
		for _, d := range debs {
			if rerr := os.Rename(d, filepath.Join(dir, filepath.Base(d))); rerr != nil && err == nil {
				err = rerr
			}
		}
		if err != nil {
			return fmt.Errorf("apt-get download %s (into %s): %v:\n%s", strings.Join(missing, " "), dir, err, out)
		}
		return nil
	}
	const attempts = 4
	b := backoff.Backoff{Initial: 2 * time.Second, Max: 10 * time.Second}
	var lastErr error
	for i := range attempts {
		found, missing := find()
		if len(missing) == 0 {
			return found, nil
		}
		if i > 0 {
			time.Sleep(b.Next())
		}
		if i == 1 && os.Geteuid() == 0 {
			if out, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
				lastErr = fmt.Errorf("%w; apt-get update: %v: %s", lastErr, uerr, out)
				continue
			}
		}
		lastErr = download(missing)
	}
	if found, missing := find(); len(missing) == 0 {
		return found, nil
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%d attempts failed, the last: %w; run apt-get update and try again", attempts, lastErr)
	}
	return nil, fmt.Errorf("%d attempts failed, the last: %w", attempts, lastErr)
}

// tarTree packs the tree at root, symlinks as symlinks, as an uncompressed
// layer of root-owned files.
func tarTree(root string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Unix(1700000000, 0)
	err := tartree.Write(tw, root, "", tartree.Options{Header: func(h *tar.Header) error {
		h.ModTime = now
		return nil
	}})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
