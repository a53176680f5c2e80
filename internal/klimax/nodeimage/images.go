package nodeimage

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// listImages asks the kubeadm we built which images it deploys and maps
// each to the program that provides it.
func (b *builder) listImages(ctx context.Context) (bool, error) {
	out, err := b.run(ctx, "", nil, nil, filepath.Join(b.bin, "kubeadm"), "config", "images", "list",
		"--kubernetes-version", b.opts.KubernetesVersion)
	if err != nil {
		return false, err
	}
	b.images = map[string]string{}
	for _, ref := range strings.Fields(out) {
		repo := ref
		if i := strings.LastIndex(ref, ":"); i > 0 {
			repo = ref[:i]
		}
		comp := path.Base(repo)
		switch comp {
		case "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd", "pause", "coredns":
		default:
			return false, fmt.Errorf("kubeadm wants image %s, which the node image does not build", ref)
		}
		b.images[ref] = comp
		b.logf("  kubeadm image %s <- %s", ref, comp)
	}
	if len(b.images) == 0 {
		return false, fmt.Errorf("kubeadm config images list printed no images")
	}
	b.images[CNIImage] = "klimax-cni"
	b.images[LocalPathImage] = "local-path"
	b.images["quay.io/metallb/controller:"+MetalLBVersion] = "controller"
	b.images["quay.io/metallb/speaker:"+MetalLBVersion] = "speaker"
	return false, nil
}

func (b *builder) rootfsPath() string {
	h := strings.NewReplacer(",", "").Replace(strings.Join(DebianPackages, ","))
	return filepath.Join(b.opts.CacheDir, fmt.Sprintf("rootfs-%s-%x.tar", b.opts.DebianSuite, shortHash(h)))
}

func shortHash(s string) uint32 {
	var h uint32 = 2166136261
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

// rootfs debootstraps the Debian suite once per package list.
func (b *builder) rootfs(ctx context.Context) (bool, error) {
	dst := b.rootfsPath()
	if exists(dst) {
		return true, nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return false, fmt.Errorf("debootstrap is not installed (apt-get install debootstrap): it builds the node's Debian rootfs")
	}
	if os.Geteuid() != 0 {
		return false, fmt.Errorf("debootstrap must run as root to build the rootfs (%s); run this once as root, later builds reuse it", dst)
	}
	dir := dst + ".d"
	os.RemoveAll(dir)
	defer os.RemoveAll(dir)
	b.logf("  debootstrap --variant=minbase %s from %s (a few minutes)", b.opts.DebianSuite, DebianMirror)
	if _, err := b.run(ctx, "", nil, nil, "debootstrap", "--variant=minbase", "--include="+strings.Join(DebianPackages, ","),
		b.opts.DebianSuite, dir, DebianMirror); err != nil {
		return false, err
	}
	// trim what a node never uses
	for _, p := range []string{"var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"} {
		_ = os.RemoveAll(filepath.Join(dir, p))
		_ = os.MkdirAll(filepath.Join(dir, p), 0o755)
	}
	if _, err := b.run(ctx, "", nil, nil, "tar", "--numeric-owner", "--xattrs", "-C", dir, "-cf", dst+".tmp", "."); err != nil {
		return false, err
	}
	return false, os.Rename(dst+".tmp", dst)
}

// tarEntry is one file of a layer we write.
type tarEntry struct {
	name string // path in the image, no leading slash
	mode int64
	data []byte // regular file content...
	src  string // ...or a file on disk
	link string // a symlink target
	dir  bool
}

// writeLayer writes entries (parents first) as a tar file.
func writeLayer(dst string, entries []tarEntry) error {
	f, err := os.Create(dst + ".tmp")
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	seen := map[string]bool{}
	var mkdirs func(p string) error
	mkdirs = func(p string) error {
		if p == "." || p == "" || seen[p] {
			return nil
		}
		if err := mkdirs(path.Dir(p)); err != nil {
			return err
		}
		seen[p] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: 0o755, ModTime: time.Unix(0, 0)})
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	for _, e := range entries {
		if err := mkdirs(path.Dir(e.name)); err != nil {
			return err
		}
		hdr := &tar.Header{Name: e.name, Mode: e.mode, ModTime: time.Unix(0, 0)}
		switch {
		case e.dir:
			if seen[e.name] {
				continue
			}
			seen[e.name] = true
			hdr.Typeflag, hdr.Name = tar.TypeDir, e.name+"/"
			if hdr.Mode == 0 {
				hdr.Mode = 0o755
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case e.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, e.link, 0o777
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case e.src != "":
			sf, err := os.Open(e.src)
			if err != nil {
				return err
			}
			st, err := sf.Stat()
			if err != nil {
				sf.Close()
				return err
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				sf.Close()
				return err
			}
			_, err = io.Copy(tw, sf)
			sf.Close()
			if err != nil {
				return err
			}
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(e.data))
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := tw.Write(e.data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(dst+".tmp", dst)
}

func layerFromFile(p string) (v1.Layer, error) {
	return tarball.LayerFromFile(p, tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
}

// image is one image: base layers plus config.
func image(layers []v1.Layer, entrypoint []string, env []string, extra map[string]string) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = goarch(), "linux"
	cf.Config.Entrypoint = entrypoint
	cf.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	cf.Config.Labels = extra
	return mutate.ConfigFile(img, cf)
}

// imagesTar depends only on the binaries and the rootfs, so it lives with
// the binaries.
func (b *builder) imagesTar() string {
	return filepath.Join(b.bin, fmt.Sprintf("images-%x.tar", shortHash(b.rootfsPath()+builderRevision)))
}

// componentImages writes every image the node preloads into one
// docker-archive tarball (images.tar), which ctr imports.
func (b *builder) componentImages(ctx context.Context) (bool, error) {
	dst := b.imagesTar()
	if exists(dst) {
		return true, nil
	}
	rootfs, err := layerFromFile(b.rootfsPath())
	if err != nil {
		return false, err
	}
	certs := filepath.Join(b.bin, "certs-layer.tar")
	if err := b.extractCerts(ctx, certs); err != nil {
		return false, err
	}
	certLayer, err := layerFromFile(certs)
	if err != nil {
		return false, err
	}
	refs := map[name.Reference]v1.Image{}
	labels := map[string]string{LabelKey: b.binKey}
	for ref, comp := range b.images {
		lp := filepath.Join(b.bin, "layer-"+comp+".tar")
		bin := "usr/local/bin/" + comp
		if comp == "coredns" {
			bin = "coredns" // its Deployment passes only args: ENTRYPOINT is /coredns
		}
		if !exists(lp) {
			if err := writeLayer(lp, []tarEntry{{name: bin, mode: 0o755, src: filepath.Join(b.bin, comp)}}); err != nil {
				return false, err
			}
		}
		l, err := layerFromFile(lp)
		if err != nil {
			return false, err
		}
		layers := []v1.Layer{certLayer, l}
		if comp == "kube-proxy" {
			layers = []v1.Layer{rootfs, l} // it runs iptables, conntrack, nft
		}
		ep := []string{"/" + bin}
		switch comp {
		case "kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd":
			ep = nil // the static pods give the command
		case "kube-proxy":
			ep = nil
		case "controller", "speaker":
			ep = []string{"/" + bin}
		}
		img, err := image(layers, ep, nil, labels)
		if err != nil {
			return false, err
		}
		tag, err := name.NewTag(ref, name.WeakValidation)
		if err != nil {
			return false, err
		}
		refs[tag] = img
	}
	b.logf("  writing %d images to %s", len(refs), dst)
	f, err := os.Create(dst + ".tmp")
	if err != nil {
		return false, err
	}
	if err := tarball.MultiRefWrite(refs, f); err != nil {
		f.Close()
		return false, err
	}
	if err := f.Close(); err != nil {
		return false, err
	}
	return false, os.Rename(dst+".tmp", dst)
}

// extractCerts makes a layer with the rootfs's CA bundle (for programs that
// talk TLS to the outside: the registry mirror).
func (b *builder) extractCerts(ctx context.Context, dst string) error {
	if exists(dst) {
		return nil
	}
	out, err := b.run(ctx, "", nil, nil, "tar", "-xOf", b.rootfsPath(), "./etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		return err
	}
	return writeLayer(dst, []tarEntry{
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: []byte(out)},
		{name: "tmp", dir: true, mode: 0o1777},
	})
}

// baseImage is the rootfs plus our files, loaded into the engine as a
// temporary tag.
func (b *builder) baseTag() string { return "klimax/node-build:" + b.key }

func (b *builder) baseImage(ctx context.Context) (bool, error) {
	if have, _ := b.imageKey(ctx, b.baseTag()); have == b.key {
		return true, nil
	}
	sandbox := ""
	for ref, comp := range b.images {
		if comp == "pause" {
			sandbox = ref
		}
	}
	data := map[string]string{"SandboxImage": sandbox, "CNIImage": CNIImage, "LocalPathImage": LocalPathImage}
	var entries []tarEntry
	add := func(file, dst string, mode int64) error {
		d, err := renderFile(file, data)
		if err != nil {
			return err
		}
		entries = append(entries, tarEntry{name: dst, mode: mode, data: d})
		return nil
	}
	for _, f := range []struct {
		file, dst string
		mode      int64
	}{
		{"klimax-entrypoint", "usr/local/bin/klimax-entrypoint", 0o755},
		{"klimax-kubelet-cgroups", "usr/local/bin/klimax-kubelet-cgroups", 0o755},
		{"kubelet.service", "etc/systemd/system/kubelet.service", 0o644},
		{"10-kubeadm.conf", "etc/systemd/system/kubelet.service.d/10-kubeadm.conf", 0o644},
		{"kubelet.slice", "etc/systemd/system/kubelet.slice", 0o644},
		{"containerd.service", "etc/systemd/system/containerd.service", 0o644},
		{"config.toml.tmpl", "etc/containerd/config.toml", 0o644},
		{"crictl.yaml", "etc/crictl.yaml", 0o644},
		{"99-klimax.conf", "etc/sysctl.d/99-klimax.conf", 0o644},
		{"default-cni.yaml.tmpl", "kind/manifests/default-cni.yaml", 0o644},
		{"default-storage.yaml.tmpl", "kind/manifests/default-storage.yaml", 0o644},
	} {
		if err := add(f.file, f.dst, f.mode); err != nil {
			return false, err
		}
	}
	entries = append(entries,
		tarEntry{name: "kind/version", mode: 0o644, data: []byte(b.opts.KubernetesVersion + "\n")},
		tarEntry{name: "kind/klimax-node-image", mode: 0o644, data: []byte(b.describe())},
		tarEntry{name: "etc/containerd/certs.d", dir: true},
		tarEntry{name: "etc/cni/net.d", dir: true},
		tarEntry{name: "opt/cni/bin", link: "/usr/lib/cni"},
		tarEntry{name: "etc/systemd/system/multi-user.target.wants/containerd.service", link: "/etc/systemd/system/containerd.service"},
		tarEntry{name: "etc/systemd/system/multi-user.target.wants/kubelet.service", link: "/etc/systemd/system/kubelet.service"},
	)
	// units a container must not run
	for _, u := range []string{"systemd-udevd.service", "systemd-udevd-control.socket", "systemd-udevd-kernel.socket",
		"systemd-udev-trigger.service", "systemd-modules-load.service", "systemd-remount-fs.service",
		"getty.target", "console-getty.service", "serial-getty@.service", "systemd-firstboot.service",
		"sys-kernel-debug.mount", "sys-kernel-tracing.mount", "sys-kernel-config.mount", "sys-fs-fuse-connections.mount",
		"kmod-static-nodes.service", "systemd-hwdb-update.service"} {
		entries = append(entries, tarEntry{name: "etc/systemd/system/" + u, link: "/dev/null"})
	}
	for _, bin := range []string{"kubeadm", "kubelet", "kubectl", "containerd", "containerd-shim-runc-v2", "ctr", "crictl"} {
		entries = append(entries, tarEntry{name: "usr/local/bin/" + bin, mode: 0o755, src: filepath.Join(b.bin, bin)})
	}
	lp := filepath.Join(b.dir, "node-layer.tar")
	if err := writeLayer(lp, entries); err != nil {
		return false, err
	}
	rootfs, err := layerFromFile(b.rootfsPath())
	if err != nil {
		return false, err
	}
	top, err := layerFromFile(lp)
	if err != nil {
		return false, err
	}
	img, err := image([]v1.Layer{rootfs, top}, []string{"/usr/local/bin/klimax-entrypoint", "/sbin/init"},
		[]string{"container=docker"}, map[string]string{LabelKey: b.key})
	if err != nil {
		return false, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return false, err
	}
	cf = cf.DeepCopy()
	cf.Config.StopSignal = "SIGRTMIN+3"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return false, err
	}
	tag, err := name.NewTag(b.baseTag())
	if err != nil {
		return false, err
	}
	return false, b.dockerLoad(ctx, tag, img)
}

func (b *builder) dockerLoad(ctx context.Context, tag name.Tag, img v1.Image) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarball.Write(tag, img, pw)) }()
	_, err := b.run(ctx, "", nil, pr, "docker", "load")
	pr.Close()
	return err
}

func (b *builder) describe() string {
	var s strings.Builder
	fmt.Fprintf(&s, "klimax node image %s (key %s)\nkubernetes %s\netcd %s\ncontainerd %s\ncrictl %s\ncoredns %s\nmetallb %s\ndebian %s\nimages:\n",
		b.opts.Tag, b.key, b.opts.KubernetesVersion, b.versions["go.etcd.io/etcd/server/v3"], ContainerdVersion, CrictlVersion,
		b.versions["coredns"], MetalLBVersion, b.opts.DebianSuite)
	var refs []string
	for r := range b.images {
		refs = append(refs, r)
	}
	sort.Strings(refs)
	for _, r := range refs {
		fmt.Fprintf(&s, "  %s\n", r)
	}
	return s.String()
}

// preload starts containerd in a container of the base image, imports
// images.tar into its k8s.io namespace (pinned, not unpacked: the CRI
// unpacks on first use), and commits the result as the node image.
func (b *builder) preload(ctx context.Context) (bool, error) {
	ctr := "klimax-node-build-" + b.key
	_, _ = b.run(ctx, "", nil, nil, "docker", "rm", "-f", ctr)
	if _, err := b.run(ctx, "", nil, nil, "docker", "run", "-d", "--privileged", "--init", "--name", ctr,
		"--entrypoint", "/bin/sleep", b.baseTag(), "infinity"); err != nil {
		return false, err
	}
	defer func() { _, _ = b.run(context.Background(), "", nil, nil, "docker", "rm", "-f", ctr) }()
	exec := func(stdin io.Reader, args ...string) (string, error) {
		a := []string{"exec"}
		if stdin != nil {
			a = append(a, "-i")
		}
		return b.run(ctx, "", nil, stdin, "docker", append(append(a, ctr), args...)...)
	}
	if _, err := exec(nil, "bash", "-c", "mkdir -p /run/containerd && (nohup containerd >/var/log/containerd-build.log 2>&1 &)"); err != nil {
		return false, err
	}
	if _, err := exec(nil, "bash", "-c", "for i in $(seq 1 60); do ctr version >/dev/null 2>&1 && exit 0; sleep 0.5; done; cat /var/log/containerd-build.log; exit 1"); err != nil {
		return false, fmt.Errorf("containerd did not start in the build container: %w", err)
	}
	f, err := os.Open(b.imagesTar())
	if err != nil {
		return false, err
	}
	defer f.Close()
	if _, err := exec(f, "ctr", "--namespace=k8s.io", "images", "import", "--no-unpack", "--digests",
		"--label=io.cri-containerd.pinned=pinned", "-"); err != nil {
		return false, err
	}
	out, err := exec(nil, "ctr", "--namespace=k8s.io", "images", "ls", "-q")
	if err != nil {
		return false, err
	}
	have := map[string]bool{}
	for _, r := range strings.Fields(out) {
		have[r] = true
	}
	for ref := range b.images {
		full := ref
		if t, err := name.NewTag(ref, name.WeakValidation); err == nil {
			full = t.Name()
		}
		if !have[ref] && !have[full] && !have["docker.io/"+ref] {
			return false, fmt.Errorf("after import containerd lacks %s (has %s)", ref, strings.Join(strings.Fields(out), " "))
		}
	}
	if _, err := exec(nil, "bash", "-c", "pkill -x containerd; for i in $(seq 1 40); do pgrep -x containerd >/dev/null || exit 0; sleep 0.25; done; exit 1"); err != nil {
		return false, err
	}
	if _, err := exec(nil, "rm", "-rf", "/var/log/containerd-build.log", "/run/containerd"); err != nil {
		return false, err
	}
	if _, err := b.run(ctx, "", nil, nil, "docker", "commit",
		"--change", `ENTRYPOINT ["/usr/local/bin/klimax-entrypoint", "/sbin/init"]`,
		"--change", `CMD []`,
		"--change", "LABEL "+LabelKey+"="+b.key,
		ctr, b.opts.Tag); err != nil {
		return false, err
	}
	_, _ = b.run(ctx, "", nil, nil, "docker", "rm", "-f", ctr)
	_, _ = b.run(ctx, "", nil, nil, "docker", "rmi", b.baseTag())
	return false, nil
}

// mirrorImage loads the registry (distribution v3) image klimax's
// pull-through mirrors run, under the name klimax uses by default.
func (b *builder) mirrorImage(ctx context.Context) (bool, error) {
	if have, _ := b.imageKey(ctx, MirrorImage); have == b.key {
		return true, nil
	}
	certs, err := layerFromFile(filepath.Join(b.bin, "certs-layer.tar"))
	if err != nil {
		return false, err
	}
	lp := filepath.Join(b.dir, "layer-registry.tar")
	cfg := []byte("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: /var/lib/registry\nhttp:\n  addr: :5000\n")
	if err := writeLayer(lp, []tarEntry{
		{name: "bin/registry", mode: 0o755, src: filepath.Join(b.bin, "registry")},
		{name: "etc/distribution/config.yml", mode: 0o644, data: cfg},
		{name: "var/lib/registry", dir: true},
	}); err != nil {
		return false, err
	}
	l, err := layerFromFile(lp)
	if err != nil {
		return false, err
	}
	img, err := image([]v1.Layer{certs, l}, []string{"/bin/registry"}, nil, map[string]string{LabelKey: b.key})
	if err != nil {
		return false, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return false, err
	}
	cf = cf.DeepCopy()
	cf.Config.Cmd = []string{"serve", "/etc/distribution/config.yml"}
	cf.Config.ExposedPorts = map[string]struct{}{"5000/tcp": {}}
	cf.Config.Volumes = map[string]struct{}{"/var/lib/registry": {}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return false, err
	}
	tag, err := name.NewTag(MirrorImage)
	if err != nil {
		return false, err
	}
	return false, b.dockerLoad(ctx, tag, img)
}

func goarch() string { return runtime.GOARCH }
