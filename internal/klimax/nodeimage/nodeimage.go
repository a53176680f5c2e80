// Package nodeimage owns klimax's offline kind node image: building it from
// parts this machine can get without pulling any image (Debian packages by
// debootstrap, Go modules by the go command), caching every part by a version
// key outside the source tree, and loading the result into the Docker engine
// as a kind node image (default klimax/node:<kubernetes version>).
//
// What the image holds, and which part of kind expects it:
//   - a Debian rootfs with systemd as /sbin/init, runc, the standard CNI
//     plugins (/opt/cni/bin), iptables, conntrack, mount tools;
//   - our entrypoint (klimax-entrypoint: shared mounts, cgroups, per-node
//     machine id, Docker DNS for pods), containerd 2 with a version-2 config
//     (k8s.io namespace, systemd cgroups, certs.d), crictl, kubeadm, kubelet
//     (systemd unit and kubeadm drop-in) and kubectl;
//   - /kind/version, /kind/manifests/default-cni.yaml (klimax-cni) and
//     default-storage.yaml (k3sm's local-path provisioner), which kind reads
//     and applies;
//   - every image `kubeadm config images list` names, under exactly those
//     names, plus klimax-cni, local-path and the MetalLB controller and
//     speaker, preloaded (pinned) in containerd's k8s.io namespace, so
//     creating a cluster pulls nothing.
//
// The Kubernetes components are built from the k8s.io/kubernetes version the
// source tree's go.mod pins (its build cache is warm); the other programs
// come from their own Go modules at pinned versions.
package nodeimage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"text/template"
	"time"
)

// Pinned versions of the parts that do not come from go.mod.
const (
	ContainerdVersion = "v2.2.9"
	CrictlVersion     = "v1.37.0" // sigs.k8s.io/cri-tools
	MetalLBVersion    = "v0.16.1" // go.universe.tf/metallb (klimax's kind.metalLBVersion)
	RegistryVersion   = "v3.0.0"  // github.com/distribution/distribution/v3
	DebianMirror      = "http://deb.debian.org/debian"
	DefaultRepository = "klimax/node"
	// CNIImage and LocalPathImage are our own programs' images; their
	// manifests use imagePullPolicy Never, so they must be preloaded.
	CNIImage       = "klimax.local/klimax-cni:v1"
	LocalPathImage = "klimax.local/local-path:v1"
	// LabelKey is the image label holding the version key it was built from.
	LabelKey = "dev.klimax.node-image.key"
	// builderRevision changes whenever the build steps change in a way the
	// embedded files do not show.
	builderRevision = "3"
)

// DebianPackages are installed by debootstrap into the node rootfs.
var DebianPackages = []string{
	"systemd", "systemd-sysv", "dbus", "runc", "containernetworking-plugins",
	"iptables", "nftables", "ebtables", "conntrack", "ethtool", "socat", "mount",
	"util-linux", "ca-certificates", "kmod", "iproute2", "libseccomp2", "procps",
	"pigz", "bash",
}

//go:embed files
var files embed.FS

// Options say what to build.
type Options struct {
	// KubernetesVersion must be the k8s.io/kubernetes version of SourceDir's
	// go.mod ("" takes it from there).
	KubernetesVersion string
	// Tag of the node image; "" is DefaultRepository:<KubernetesVersion>.
	Tag string
	// SourceDir is the root of the k3sm module (where go.mod is).
	SourceDir string
	// CacheDir holds the parts; "" is DefaultCacheDir().
	CacheDir string
	// DebianSuite is the release debootstrap installs; "" is this machine's
	// (VERSION_CODENAME of /etc/os-release), else bookworm.
	DebianSuite string
	// Rebuild ignores an image already in the engine with the same key (the
	// cached parts are still reused).
	Rebuild bool
	// Out gets one progress line per step.
	Out io.Writer
}

// Result is what Build did.
type Result struct {
	Tag, Key string
	// Cached: the engine already had the image with this key.
	Cached bool
	// MirrorImage is the registry image loaded into the engine for
	// klimax's pull-through mirrors.
	MirrorImage string
	// MetalLBManifest is MetalLB's own install manifest (metallb-native.yaml
	// of the module MetalLB was built from), whose images the node preloads;
	// the CLI seeds klimax's manifest cache with it.
	MetalLBManifest []byte
	Steps           []Step
}

// Step is one timed part of the build.
type Step struct {
	Name     string
	Duration time.Duration
	Cached   bool
}

// DefaultCacheDir is $XDG_CACHE_HOME/klimax/node-image, else
// ~/.cache/klimax/node-image.
func DefaultCacheDir() string {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "klimax", "node-image")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".cache", "klimax", "node-image")
	}
	return filepath.Join(os.TempDir(), "klimax-node-image")
}

// DefaultTag is the node image tag for a Kubernetes version.
func DefaultTag(version string) string { return DefaultRepository + ":" + version }

type builder struct {
	opts     Options
	out      io.Writer
	versions map[string]string // module path -> version from go.mod
	key      string
	binKey   string
	dir      string // CacheDir/<version>-<key>
	bin      string
	images   map[string]string // kubeadm image name -> component
	res      Result
}

// Build builds the node image (or finds it built) and loads it into the
// Docker engine the docker CLI talks to.
func Build(ctx context.Context, opts Options) (*Result, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("node-image build runs on Linux (it needs debootstrap and runs the Kubernetes build for linux): run it inside the klimax VM (`klimax shell`) or on a Linux machine")
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if opts.SourceDir == "" {
		opts.SourceDir = "."
	}
	abs, err := filepath.Abs(opts.SourceDir)
	if err != nil {
		return nil, err
	}
	opts.SourceDir = abs
	if opts.CacheDir == "" {
		opts.CacheDir = DefaultCacheDir()
	}
	if opts.DebianSuite == "" {
		opts.DebianSuite = hostSuite()
	}
	for _, tool := range []string{"go", "docker"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("node-image build needs %s in PATH: %v", tool, err)
		}
	}
	b := &builder{opts: opts, out: opts.Out}
	if err := b.resolve(ctx); err != nil {
		return nil, err
	}
	if b.opts.Tag == "" {
		b.opts.Tag = DefaultTag(b.opts.KubernetesVersion)
	}
	b.res.Tag, b.res.Key = b.opts.Tag, b.key
	b.res.MirrorImage = MirrorImage
	b.dir = filepath.Join(opts.CacheDir, b.opts.KubernetesVersion+"-"+b.key)
	b.bin = filepath.Join(opts.CacheDir, "bin-"+b.opts.KubernetesVersion+"-"+b.binKey)
	for _, d := range []string{b.bin, b.dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	b.logf("node image %s (key %s, binaries key %s, cache %s)", b.opts.Tag, b.key, b.binKey, opts.CacheDir)
	if err := b.metallbManifest(ctx); err != nil {
		return nil, err
	}
	if !opts.Rebuild {
		if have, _ := b.imageKey(ctx, b.opts.Tag); have == b.key {
			if have, _ := b.imageKey(ctx, MirrorImage); have == b.key {
				b.logf("up to date: %s is already built from key %s", b.opts.Tag, b.key)
				b.res.Cached = true
				return &b.res, nil
			}
		}
	}
	steps := []struct {
		name string
		fn   func(context.Context) (bool, error)
	}{
		{"Kubernetes and node binaries", b.buildBinaries},
		{"kubeadm image list", b.listImages},
		{"Debian rootfs (debootstrap " + opts.DebianSuite + ")", b.rootfs},
		{"component images", b.componentImages},
		{"node base image", b.baseImage},
		{"preload images into containerd, commit " + b.opts.Tag, b.preload},
		{"registry mirror image " + MirrorImage, b.mirrorImage},
	}
	for i, s := range steps {
		start := time.Now()
		b.logf("[%d/%d] %s", i+1, len(steps), s.name)
		cached, err := s.fn(ctx)
		if err != nil {
			return nil, fmt.Errorf("node image: %s: %w", s.name, err)
		}
		d := time.Since(start).Round(100 * time.Millisecond)
		b.res.Steps = append(b.res.Steps, Step{Name: s.name, Duration: d, Cached: cached})
		how := "done"
		if cached {
			how = "cached"
		}
		b.logf("[%d/%d] %s: %s in %s", i+1, len(steps), s.name, how, d)
	}
	b.prune()
	return &b.res, nil
}

// prune removes the parts of earlier keys of this Kubernetes version (a
// changed file or pin leaves them behind; each is hundreds of MB).
func (b *builder) prune() {
	for _, pat := range []string{b.opts.KubernetesVersion + "-*", "bin-" + b.opts.KubernetesVersion + "-*"} {
		old, _ := filepath.Glob(filepath.Join(b.opts.CacheDir, pat))
		for _, d := range old {
			if d == b.dir || d == b.bin {
				continue
			}
			if err := os.RemoveAll(d); err == nil {
				b.logf("  removed stale cache %s", d)
			}
		}
	}
}

// metallbManifest reads metallb-native.yaml from the MetalLB module.
func (b *builder) metallbManifest(ctx context.Context) error {
	out, err := b.goCmd(ctx, b.opts.CacheDir, nil, "mod", "download", "-json", "go.universe.tf/metallb@"+MetalLBVersion)
	if err != nil {
		return fmt.Errorf("MetalLB module %s: %w", MetalLBVersion, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal([]byte(out), &mod); err != nil || mod.Dir == "" {
		return fmt.Errorf("go mod download go.universe.tf/metallb@%s printed no directory: %v", MetalLBVersion, err)
	}
	data, err := os.ReadFile(filepath.Join(mod.Dir, "config", "manifests", "metallb-native.yaml"))
	if err != nil {
		return err
	}
	b.res.MetalLBManifest = data
	return nil
}

func (b *builder) logf(format string, args ...any) {
	fmt.Fprintf(b.out, format+"\n", args...)
}

// resolve reads the module versions go.mod pins and computes the key.
func (b *builder) resolve(ctx context.Context) error {
	out, err := b.goCmd(ctx, b.opts.SourceDir, nil, "list", "-m", "-f", "{{.Path}} {{.Version}}",
		"github.com/k3sm-dev/k3sm", "k8s.io/kubernetes", "go.etcd.io/etcd/server/v3")
	if err != nil {
		return fmt.Errorf("%s is not the k3sm source tree (node-image build builds Kubernetes from its go.mod; run it from the clone or pass --source): %w", b.opts.SourceDir, err)
	}
	b.versions = map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			b.versions[f[0]] = f[1]
		}
	}
	kv := b.versions["k8s.io/kubernetes"]
	if kv == "" {
		return fmt.Errorf("go.mod of %s does not require k8s.io/kubernetes", b.opts.SourceDir)
	}
	if b.opts.KubernetesVersion == "" {
		b.opts.KubernetesVersion = kv
	}
	if b.opts.KubernetesVersion != kv {
		return fmt.Errorf("--kubernetes-version %s: this source tree builds k8s.io/kubernetes %s (its go.mod) and nothing else offline; use --kubernetes-version %s", b.opts.KubernetesVersion, kv, kv)
	}
	// binKey covers what the binaries are built from; key adds the rootfs
	// and the files of the image, so editing a unit does not rebuild Go.
	h := sha256.New()
	fmt.Fprintln(h, builderRevision, kv, b.versions["go.etcd.io/etcd/server/v3"], ContainerdVersion, CrictlVersion,
		MetalLBVersion, RegistryVersion, runtime.Version(), runtime.GOARCH)
	// our own programs are part of the key: hash their sources
	for _, d := range []string{"etcd", "pause", "klimax-cni", "local-path"} {
		ents, err := os.ReadDir(filepath.Join(b.opts.SourceDir, "internal/klimax/nodeimage/cmd", d))
		if err != nil {
			return err
		}
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), "_test.go") {
				continue // tests are not in the binary
			}
			data, err := os.ReadFile(filepath.Join(b.opts.SourceDir, "internal/klimax/nodeimage/cmd", d, e.Name()))
			if err != nil {
				return err
			}
			fmt.Fprintln(h, d, e.Name(), len(data))
			h.Write(data)
		}
	}
	if data, err := files.ReadFile("files/coredns-main.go.txt"); err == nil {
		h.Write(data)
	}
	b.binKey = hex.EncodeToString(h.Sum(nil))[:12]
	fmt.Fprintln(h, b.opts.DebianSuite, strings.Join(DebianPackages, ","))
	err = fsWalk(func(name string, data []byte) {
		fmt.Fprintln(h, name, len(data))
		h.Write(data)
	})
	if err != nil {
		return err
	}
	b.key = hex.EncodeToString(h.Sum(nil))[:12]
	return nil
}

func fsWalk(fn func(name string, data []byte)) error {
	ents, err := files.ReadDir("files")
	if err != nil {
		return err
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, n := range names {
		data, err := files.ReadFile("files/" + n)
		if err != nil {
			return err
		}
		fn(n, data)
	}
	return nil
}

func hostSuite() string {
	data, err := os.ReadFile("/etc/os-release")
	if err == nil && bytes.Contains(data, []byte("ID=debian")) {
		for _, l := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "VERSION_CODENAME="); ok && v != "" {
				return strings.Trim(v, `"`)
			}
		}
	}
	return "bookworm"
}

// run runs a command, streaming nothing; its combined output is in the error.
func (b *builder) run(ctx context.Context, dir string, env []string, stdin io.Reader, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 4000 {
			msg = "..." + msg[len(msg)-4000:]
		}
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return stdout.String(), nil
}

func (b *builder) goCmd(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	return b.run(ctx, dir, append([]string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + runtime.GOARCH, "GOFLAGS=-mod=mod"}, env...), nil, "go", args...)
}

func (b *builder) imageKey(ctx context.Context, ref string) (string, error) {
	out, err := b.run(ctx, "", nil, nil, "docker", "image", "inspect", "--format", `{{index .Config.Labels "`+LabelKey+`"}}`, ref)
	return strings.TrimSpace(out), err
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// writeTemplate renders files/<name> with data.
func renderFile(name string, data any) ([]byte, error) {
	raw, err := files.ReadFile("files/" + name)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(name, ".tmpl") {
		return raw, nil
	}
	t, err := template.New(name).Option("missingkey=error").Parse(string(raw))
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, data); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
