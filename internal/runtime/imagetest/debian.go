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
// downloading with apt-get those not in DebCacheDir yet. A download that
// fails is tried once more after apt-get update (as root), for a machine
// whose package lists are missing or out of date.
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
	found, missing := find()
	if len(missing) == 0 {
		return found, nil
	}
	download := func() error {
		cmd := exec.Command("apt-get", append([]string{"download", "-q"}, missing...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get download %s (in %s): %v: %s", strings.Join(missing, " "), dir, err, out)
		}
		return nil
	}
	if err := download(); err != nil {
		if os.Geteuid() != 0 {
			return nil, fmt.Errorf("%w; run apt-get update and try again", err)
		}
		if out, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return nil, fmt.Errorf("%w; apt-get update: %v: %s", err, uerr, out)
		}
		if err := download(); err != nil {
			return nil, err
		}
	}
	found, missing = find()
	if len(missing) != 0 {
		return nil, fmt.Errorf("apt-get download left no .deb of %s in %s", strings.Join(missing, " "), dir)
	}
	return found, nil
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
