package nodeimage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/klimax/docker"
)

// MirrorImage is the registry image klimax's pull-through mirrors run
// (docker.DefaultMirrorImage); Build loads one built from
// github.com/distribution/distribution/v3 under that name.
const MirrorImage = docker.DefaultMirrorImage

// component is one program of the node image and how to build it.
type component struct {
	name string
	// pkg is built with `go build` in the source tree (the k3sm module)...
	pkg string
	// ...or, when mod is set, with `go install pkg@version` from its own
	// module, or (main set) in a generated module whose main.go is main.
	mod, version, main string
	tags               string
	kubeVersion        bool // set the k8s version variables
}

func (b *builder) components() []component {
	return []component{
		{name: "kubeadm", pkg: "k8s.io/kubernetes/cmd/kubeadm", kubeVersion: true},
		{name: "kubelet", pkg: "k8s.io/kubernetes/cmd/kubelet", kubeVersion: true},
		{name: "kubectl", pkg: "k8s.io/kubernetes/cmd/kubectl", kubeVersion: true},
		{name: "kube-apiserver", pkg: "k8s.io/kubernetes/cmd/kube-apiserver", kubeVersion: true},
		{name: "kube-controller-manager", pkg: "k8s.io/kubernetes/cmd/kube-controller-manager", kubeVersion: true},
		{name: "kube-scheduler", pkg: "k8s.io/kubernetes/cmd/kube-scheduler", kubeVersion: true},
		{name: "kube-proxy", pkg: "k8s.io/kubernetes/cmd/kube-proxy", kubeVersion: true},
		{name: "etcd", pkg: "./internal/klimax/nodeimage/cmd/etcd"},
		{name: "pause", pkg: "./internal/klimax/nodeimage/cmd/pause"},
		{name: "klimax-cni", pkg: "./internal/klimax/nodeimage/cmd/klimax-cni"},
		{name: "local-path", pkg: "./internal/klimax/nodeimage/cmd/local-path"},
		{name: "crictl", mod: "sigs.k8s.io/cri-tools", pkg: "sigs.k8s.io/cri-tools/cmd/crictl", version: CrictlVersion},
		{name: "containerd", mod: "github.com/containerd/containerd/v2", pkg: "github.com/containerd/containerd/v2/cmd/containerd", version: ContainerdVersion, tags: "no_btrfs,no_devmapper,no_zfs,no_aufs"},
		{name: "containerd-shim-runc-v2", mod: "github.com/containerd/containerd/v2", pkg: "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2", version: ContainerdVersion},
		{name: "ctr", mod: "github.com/containerd/containerd/v2", pkg: "github.com/containerd/containerd/v2/cmd/ctr", version: ContainerdVersion},
		{name: "coredns", mod: "github.com/coredns/coredns", version: b.corednsVersion(), main: "coredns-main.go.txt"},
		{name: "controller", mod: "go.universe.tf/metallb", pkg: "go.universe.tf/metallb/controller", version: MetalLBVersion},
		{name: "speaker", mod: "go.universe.tf/metallb", pkg: "go.universe.tf/metallb/speaker", version: MetalLBVersion},
		{name: "registry", mod: "github.com/distribution/distribution/v3", pkg: "github.com/distribution/distribution/v3/cmd/registry", version: RegistryVersion},
	}
}

// corednsVersion is the CoreDNS version kubeadm deploys for this Kubernetes
// version (its constants.CoreDNSVersion, read from the module source).
func (b *builder) corednsVersion() string {
	if v := b.versions["coredns"]; v != "" {
		return v
	}
	return "v1.14.6"
}

func (b *builder) ldflags(c component) string {
	fl := []string{"-s", "-w"}
	if c.kubeVersion {
		kv := b.opts.KubernetesVersion
		var major, minor string
		if p := strings.Split(strings.TrimPrefix(kv, "v"), "."); len(p) >= 2 {
			major, minor = p[0], p[1]
		}
		for _, p := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
			fl = append(fl, "-X", p+".gitVersion="+kv, "-X", p+".gitMajor="+major, "-X", p+".gitMinor="+minor,
				"-X", p+".gitTreeState=clean", "-X", p+".buildDate=1970-01-01T00:00:00Z")
		}
	}
	return strings.Join(fl, " ")
}

func (b *builder) buildBinaries(ctx context.Context) (bool, error) {
	if err := b.readCoreDNSVersion(); err != nil {
		return false, err
	}
	all := true
	for _, c := range b.components() {
		dst := filepath.Join(b.bin, c.name)
		if exists(dst) {
			continue
		}
		all = false
		start := time.Now()
		var err error
		switch {
		case c.main != "":
			err = b.buildGenerated(ctx, c, dst)
		case c.mod != "":
			gobin := filepath.Join(b.bin, ".gobin-"+c.name)
			_, err = b.goCmd(ctx, b.opts.CacheDir, []string{"GOBIN=" + gobin},
				"install", "-tags", c.tags, "-ldflags", b.ldflags(c), c.pkg+"@"+c.version)
			if err == nil {
				err = os.Rename(filepath.Join(gobin, filepath.Base(c.pkg)), dst)
			}
			os.RemoveAll(gobin)
		default:
			_, err = b.goCmd(ctx, b.opts.SourceDir, nil, "build", "-ldflags", b.ldflags(c), "-o", dst+".tmp", c.pkg)
			if err == nil {
				err = os.Rename(dst+".tmp", dst)
			}
		}
		if err != nil {
			return false, fmt.Errorf("build %s: %w", c.name, err)
		}
		from := c.pkg
		if c.mod != "" {
			from = c.mod + "@" + c.version
		}
		b.logf("  built %s (%s) in %s", c.name, from, time.Since(start).Round(100*time.Millisecond))
	}
	return all, nil
}

// buildGenerated builds c in a module of its own under the cache: main.go
// is c.main, the only requirement c.mod@c.version (go mod tidy resolves the
// rest as that module's go.mod says).
func (b *builder) buildGenerated(ctx context.Context, c component, dst string) error {
	dir := filepath.Join(b.bin, ".mod-"+c.name)
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	src, err := files.ReadFile("files/" + c.main)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), src, 0o644); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"mod", "init", "klimax.local/" + c.name},
		{"get", c.mod + "@" + c.version},
		{"mod", "tidy"},
		{"build", "-ldflags", b.ldflags(c), "-o", dst, "."},
	} {
		if _, err := b.goCmd(ctx, dir, nil, args...); err != nil {
			return err
		}
	}
	return nil
}

// readCoreDNSVersion takes the CoreDNS version from kubeadm's constants in
// the module cache, so the image kubeadm deploys is the version we build.
func (b *builder) readCoreDNSVersion() error {
	out, err := b.goCmd(context.Background(), b.opts.SourceDir, nil, "list", "-f", "{{.Dir}}", "k8s.io/kubernetes/cmd/kubeadm/app/constants")
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(strings.TrimSpace(out), "constants.go"))
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if v, ok := strings.CutPrefix(l, "CoreDNSVersion = "); ok {
			b.versions["coredns"] = strings.Trim(v, `"`)
			return nil
		}
	}
	return fmt.Errorf("no CoreDNSVersion in kubeadm's constants.go")
}
