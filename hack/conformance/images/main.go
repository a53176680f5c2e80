//go:build linux

// Command images builds, without pulling anything, the container images the
// upstream Kubernetes conformance specs ([Conformance] in e2e.test) run,
// as docker-archive tarballs named under one registry host:
//
//	go run ./hack/conformance/images -out DIR -registry HOST -module MODDIR [-cache CACHEDIR]
//
// Go programs are built from the k8s.io/kubernetes module in MODDIR (the
// throw-away module hack/conformance/tools.sh makes) and from k3sm's own
// module (etcd, pause), busybox from its source; everything else comes
// from one Debian rootfs (debootstrap --variant=minbase of this machine's
// suite from deb.debian.org), cached per machine. Image names and tags are read from
// the pinned test/utils/image/manifest.go.
//
// DIR gets one tarball per image (DIR/<repository path>_<tag>.tar, tagged
// with its full reference), images.txt (the references, one a line) and
// repo-list.yaml (KUBE_TEST_REPO_LIST: the manifest's registries mapped
// onto HOST; invalidRegistry and privateRegistry stay upstream's). A run
// whose outputs already exist for the same Kubernetes version, registry
// and recipe (builderVersion) does nothing.
//
// Built (manifest ImageID: what stands in for upstream's image):
//   - Agnhost, AgnhostPrev: Debian rootfs (sh, bash, dig, nslookup, curl,
//     nc, ip, ss, socat, ipcs, ...) + /agnhost built from the pinned
//     source for both tags (-X main.Version=<tag>), /agnhost-2, /uploads,
//     porter's localhost.crt/.key, user-defined-in-image (1000) in
//     group-defined-in-image (50000). Without upstream's /coredns and the
//     fake registry's /var/registry (GitHub and registry.k8s.io downloads,
//     no conformance spec uses them).
//   - BusyBox (and busybox:1.36.1-1, which DRA/CSI-mock manifests and node
//     e2e name): busybox 1.37.0 built from source (the orig tarball of
//     Debian's source package, without Debian's patches) with upstream's
//     defconfig, static against this machine's glibc, without tc; all
//     its applets as symlinks. Built once per machine (needs gcc, make,
//     bzip2, libc6-dev).
//   - Nginx, NginxNew: Debian's nginx (1.22) on port 80; the two tags differ
//     only by label.
//   - Kitten, Nautilus, Nonewprivs, NonRoot, APIServer (k8s.io/sample-apiserver
//     at the pinned version), Pause (k3sm's pause), Etcd (etcd at k3sm's
//     go.mod version, no etcdctl), GlibcDnsTesting (the DNS conformance
//     specs' glibc prober; without its coredns), IpcUtils.
//
// Skipped, as no [Conformance] spec uses them: AgnhostPrivate
// (privateRegistry, needs credentials), AppArmorLoader, DistrolessIptables,
// InvalidRegistryImage (meant not to exist), NFSProvisioner, NodePerf*,
// Perl, RegressionIssue74839, ResourceConsumer, VolumeNFSServer,
// VolumeISCSIServer, SampleDevicePlugin and the CSI driver/sidecar images
// of test/e2e/testing-manifests (storage specs of drivers, not
// conformance).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// builderVersion is bumped whenever a recipe changes: it keys the cached
// binaries, layers and images.
const builderVersion = "3"

// stampName in -out records which build its files are.
const stampName = ".k3sm-conformance-images"

type builder struct {
	out, registry, module, cache string

	k8sVersion  string
	suite       string
	repo        string
	etcdVersion string
	key         string

	k8sSrc string    // k8s.io/kubernetes in the module cache
	man    *manifest // its test/utils/image/manifest.go
	rootfs string    // the Debian rootfs directory
	bbBin  string    // the static busybox binary

	mu     sync.Mutex
	layers map[string]v1.Layer
}

var start = time.Now()

func now() time.Time { return time.Now() }

func since(t time.Time) string { return time.Since(t).Round(100 * time.Millisecond).String() }

func (b *builder) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "conformance images [%s +%6.1fs] %s\n", time.Now().Format("15:04:05"), time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

func main() {
	home, _ := os.UserHomeDir()
	b := &builder{layers: map[string]v1.Layer{}}
	flag.StringVar(&b.out, "out", "", "directory to write the image tarballs, images.txt and repo-list.yaml to")
	flag.StringVar(&b.registry, "registry", "", "registry host every image is named under, e.g. 127.0.0.1:5000")
	flag.StringVar(&b.module, "module", "", "the Go module hack/conformance/tools.sh makes (requires k8s.io/kubernetes)")
	flag.StringVar(&b.cache, "cache", filepath.Join(home, ".cache", "k3sm-conformance", "images-cache"), "cache of the Debian rootfs, binaries, layers and images")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := b.run(ctx); err != nil {
		b.logf("error: %v", err)
		os.Exit(1)
	}
}

func (b *builder) run(ctx context.Context) error {
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if b.out == "" || b.registry == "" || b.module == "" {
		return errors.New("usage: go run ./hack/conformance/images -out DIR -registry HOST -module MODDIR [-cache CACHEDIR]")
	}
	if err := checkRegistry(b.registry); err != nil {
		return err
	}
	var err error
	for _, p := range []*string{&b.out, &b.module, &b.cache} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	if b.k8sVersion, err = moduleK8sVersion(b.module); err != nil {
		return err
	}
	if b.repo, err = repoRoot(); err != nil {
		return err
	}
	b.suite = hostSuite()
	b.etcdVersion = repoEtcdVersion(b.repo)
	b.key = b.outputKey()

	if files, ok := upToDate(b.out, b.key); ok {
		b.logf("%d images in %s are up to date (k8s %s, registry %s, recipe %s)", len(files)-2, b.out, b.k8sVersion, b.registry, builderVersion)
		return nil
	}
	// One build at a time per cache (another run waits, then finds its
	// results).
	if err := os.MkdirAll(b.cache, 0o755); err != nil {
		return fmt.Errorf("cache directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(b.cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b.logf("waiting for another build using %s", b.cache)
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			return err
		}
	}
	done := filepath.Join(b.cache, "images-"+b.key)
	if _, err := os.Stat(done); err != nil {
		if err := b.build(ctx, done); err != nil {
			return err
		}
	} else {
		b.logf("images for this key are cached in %s", done)
	}
	t := now()
	if err := install(done, b.out, b.key); err != nil {
		return fmt.Errorf("installing the images into %s: %w", b.out, err)
	}
	b.logf("wrote %s (images.txt, repo-list.yaml and the tarballs) in %s", b.out, since(t))
	return nil
}

// checkRegistry accepts a registry host (with port and optional path),
// not a URL.
func checkRegistry(r string) error {
	if strings.Contains(r, "://") || strings.HasSuffix(r, "/") || strings.ContainsAny(r, " @") {
		return fmt.Errorf("-registry %q: give a host[:port], such as 127.0.0.1:5000 (no scheme, no trailing slash)", r)
	}
	if _, err := name.NewRepository(r + "/x/busybox"); err != nil {
		return fmt.Errorf("-registry %q: %v", r, err)
	}
	return nil
}

// outputKey is what the outputs depend on.
func (b *builder) outputKey() string {
	h := sha256.Sum256([]byte(strings.Join([]string{
		builderVersion, b.k8sVersion, b.registry, rootfsKey(b.suite), b.etcdVersion, runtime.GOARCH,
	}, "\n")))
	return hex.EncodeToString(h[:])[:16]
}

// build makes every image into the cache directory done (through a
// temporary directory).
func (b *builder) build(ctx context.Context, done string) error {
	b.logf("building the conformance images of k8s.io/kubernetes %s for %s (Debian %s, %s; cache %s)", b.k8sVersion, b.registry, b.suite, runtime.GOARCH, b.cache)
	var err error
	if b.k8sSrc, err = b.k8sSource(ctx); err != nil {
		return err
	}
	if b.man, err = parseManifestFile(filepath.Join(b.k8sSrc, "test", "utils", "image", "manifest.go")); err != nil {
		return err
	}
	rs, cs, err := b.plan()
	if err != nil {
		return err
	}

	// The Debian rootfs and its layer (network, then one core) and busybox
	// while the Go programs build.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var rootErr, binErr, bbErr error
	wg.Add(3)
	go func() {
		defer wg.Done()
		t := now()
		if b.rootfs, rootErr = b.ensureRootfs(ctx); rootErr != nil {
			cancel()
			return
		}
		b.logf("Debian rootfs layer")
		if _, rootErr = b.debianLayer(); rootErr != nil {
			cancel()
			return
		}
		b.logf("Debian rootfs and its layer ready in %s", since(t))
	}()
	go func() {
		defer wg.Done()
		t := now()
		if binErr = b.buildBinaries(ctx); binErr != nil {
			cancel()
			return
		}
		b.logf("Go programs ready in %s", since(t))
	}()
	go func() {
		defer wg.Done()
		if b.bbBin, bbErr = b.ensureBusybox(ctx); bbErr != nil {
			cancel()
		}
	}()
	wg.Wait()
	if err := errors.Join(rootErr, binErr, bbErr); err != nil {
		return err
	}

	tmp := done + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var refs []string
	for i, r := range rs {
		c := cs[i]
		ref := b.man.ref(b.registry, c)
		tag, err := name.NewTag(ref)
		if err != nil {
			return fmt.Errorf("image reference %s: %w", ref, err)
		}
		t := now()
		img, err := r.build(b, c)
		if err != nil {
			return fmt.Errorf("image %s (%s): %w", ref, r.id, err)
		}
		file := fileName(ref)
		if err := tarball.WriteToFile(filepath.Join(tmp, file), tag, img); err != nil {
			return fmt.Errorf("writing %s: %w", file, err)
		}
		digest, _ := img.Digest()
		b.logf("image %s -> %s (%s, %s)", ref, file, shortDigest(digest), since(t))
		refs = append(refs, ref)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	var skipped []string
	for _, id := range b.man.ids() {
		found := false
		for _, r := range rs {
			found = found || r.id == id
		}
		if !found {
			skipped = append(skipped, id)
		}
	}
	b.logf("not built (no conformance spec uses them): %s", strings.Join(skipped, ", "))
	if err := os.WriteFile(filepath.Join(tmp, "images.txt"), []byte(strings.Join(refs, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "repo-list.yaml"), []byte(b.man.repoListYAML(b.registry)), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, done); err != nil {
		return err
	}
	// Older keys' images (another registry, an older recipe) are dropped:
	// each is about a gigabyte. Outputs already linked from them stay.
	// So are the layers and Debian rootfs of older recipes and package
	// lists (the Go programs are kept: they take minutes to build).
	olds, _ := filepath.Glob(filepath.Join(b.cache, "images-*"))
	for _, o := range olds {
		if o != done && !strings.HasSuffix(o, ".tmp") {
			os.RemoveAll(o)
		}
	}
	olds, _ = filepath.Glob(filepath.Join(b.cache, "layers", "*"))
	for _, o := range olds {
		if o != b.layerDir() {
			os.RemoveAll(o)
		}
	}
	olds, _ = filepath.Glob(filepath.Join(b.cache, "rootfs-*"))
	for _, o := range olds {
		if o != b.rootfs && !strings.HasSuffix(o, ".tmp") {
			_ = safeRemoveAll(o)
		}
	}
	return nil
}

func shortDigest(h v1.Hash) string {
	s := h.String()
	if len(s) > 19 {
		return s[:19]
	}
	return s
}

// upToDate says whether out holds the outputs of key: its stamp names
// the key and every file it lists is there with its size.
func upToDate(out, key string) ([]string, bool) {
	data, err := os.ReadFile(filepath.Join(out, stampName))
	if err != nil {
		return nil, false
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) < 2 || lines[0] != "key "+key {
		return nil, false
	}
	var files []string
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 3 || f[0] != "file" {
			return nil, false
		}
		size, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return nil, false
		}
		fi, err := os.Stat(filepath.Join(out, f[1]))
		if err != nil || fi.Size() != size {
			return nil, false
		}
		files = append(files, f[1])
	}
	return files, true
}

// stampFiles lists the files of an old stamp (to remove the ones a new
// build no longer makes).
func stampFiles(out string) []string {
	data, err := os.ReadFile(filepath.Join(out, stampName))
	if err != nil {
		return nil
	}
	var files []string
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "file" && !strings.ContainsAny(f[1], `/\`) {
			files = append(files, f[1])
		}
	}
	return files
}

// install hard-links (or copies, across file systems) the files of the
// cached build src into out, then writes out's stamp.
func install(src, out, key string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	old := stampFiles(out)
	os.Remove(filepath.Join(out, stampName))
	var stamp strings.Builder
	fmt.Fprintf(&stamp, "key %s\n", key)
	have := map[string]bool{}
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, n := range names {
		s, d := filepath.Join(src, n), filepath.Join(out, n)
		if err := linkOrCopy(s, d); err != nil {
			return err
		}
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		have[n] = true
		fmt.Fprintf(&stamp, "file %s %d\n", n, fi.Size())
	}
	for _, n := range old {
		if !have[n] {
			os.Remove(filepath.Join(out, n))
		}
	}
	return os.WriteFile(filepath.Join(out, stampName), []byte(stamp.String()), 0o644)
}

func linkOrCopy(src, dst string) error {
	if err := os.Remove(dst); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, in); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}
