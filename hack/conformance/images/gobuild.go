//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
)

// goBinary is one static Go program an image carries.
type goBinary struct {
	name    string // file name in the binary cache
	pkg     string // package to build
	inRepo  bool   // built in the k3sm module (else in -module)
	ldflags string
}

// goBinaries are built one after the other (go build already uses every
// core), while debootstrap downloads.
func (b *builder) goBinaries() []goBinary {
	var bins []goBinary
	for _, v := range b.agnhostVersions() {
		bins = append(bins, goBinary{name: "agnhost-" + v, pkg: "k8s.io/kubernetes/test/images/agnhost",
			ldflags: "-s -w -X 'main.Version=" + v + "'"})
	}
	bins = append(bins,
		goBinary{name: "sample-apiserver", pkg: "k8s.io/sample-apiserver", ldflags: "-s -w"},
		goBinary{name: "nnp", pkg: "k8s.io/kubernetes/test/images/nonewprivs", ldflags: "-s -w"},
		// k3sm's own pause (the klimax node image's): waits for SIGINT or
		// SIGTERM and exits 0, reaping children meanwhile, as upstream's.
		goBinary{name: "pause", pkg: "./internal/klimax/nodeimage/cmd/pause", inRepo: true, ldflags: "-s -w"},
		// etcd's own server main at the version k3sm's go.mod pins (as
		// internal/testutil/dbtest.BuildEtcd builds it), here static.
		goBinary{name: "etcd", pkg: "./internal/klimax/nodeimage/cmd/etcd", inRepo: true, ldflags: "-s -w"},
	)
	return bins
}

// binVersion is bumped when goBinaries changes (a package, ldflags).
const binVersion = "1"

// binDir is where built programs are kept: by Kubernetes version, the
// etcd version of k3sm's go.mod and binVersion (not builderVersion: a
// recipe change does not rebuild the programs).
func (b *builder) binDir() string {
	return filepath.Join(b.cache, "bin", fmt.Sprintf("%s-etcd%s-b%s-%s", b.k8sVersion, b.etcdVersion, binVersion, runtime.GOARCH))
}

// buildBinaries builds every program not yet in the binary cache.
func (b *builder) buildBinaries(ctx context.Context) error {
	dir := b.binDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, bin := range b.goBinaries() {
		dst := filepath.Join(dir, bin.name)
		if _, err := os.Stat(dst); err == nil {
			b.logf("go build %s: cached", bin.name)
			continue
		}
		where, flags := b.module, "-mod=mod"
		if bin.inRepo {
			// never touch k3sm's go.mod
			where, flags = b.repo, "-mod=readonly"
		}
		b.logf("go build %s (%s, in %s)", bin.name, bin.pkg, where)
		start := now()
		tmp := dst + ".tmp"
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", bin.ldflags, "-o", tmp, bin.pkg)
		cmd.Dir = where
		cmd.Env = append(os.Environ(), "GOFLAGS="+flags, "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp)
			hint := ""
			if !bin.inRepo {
				hint = fmt.Sprintf(" (is %s the module hack/conformance/tools.sh makes, with the Go module proxy reachable?)", b.module)
			}
			return fmt.Errorf("go build %s in %s failed%s: %v\n%s", bin.pkg, where, hint, err, out)
		}
		if err := os.Rename(tmp, dst); err != nil {
			return err
		}
		b.logf("go build %s: done in %s", bin.name, since(start))
	}
	return nil
}

func (b *builder) binary(name string) string { return filepath.Join(b.binDir(), name) }

// moduleK8sVersion reads the k8s.io/kubernetes version the -module
// go.mod requires.
func moduleK8sVersion(modDir string) (string, error) {
	p := filepath.Join(modDir, "go.mod")
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("-module %s has no go.mod (%v): run hack/conformance/tools.sh first, it makes the module in ~/.cache/k3sm-conformance/<version>/mod", modDir, err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v[0-9][^\s]*)`)
	s := bufio.NewScanner(f)
	for s.Scan() {
		if m := re.FindStringSubmatch(s.Text()); m != nil {
			return m[1], nil
		}
	}
	return "", fmt.Errorf("%s requires no k8s.io/kubernetes version: is -module the directory hack/conformance/tools.sh makes?", p)
}

// repoRoot finds the k3sm checkout (for etcd and pause) from the working
// directory up.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(data)), "module github.com/k3sm-dev/k3sm") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("run this inside the k3sm checkout (go run ./hack/conformance/images ...): it builds etcd and pause from k3sm's module")
		}
		dir = parent
	}
}

// repoEtcdVersion is the go.etcd.io/etcd/server/v3 version k3sm's go.mod
// pins.
func repoEtcdVersion(repo string) string {
	data, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		return "unknown"
	}
	m := regexp.MustCompile(`(?m)^\s*go\.etcd\.io/etcd/server/v3\s+(v\S+)`).FindSubmatch(data)
	if m == nil {
		return "unknown"
	}
	return string(m[1])
}

// k8sSource is k8s.io/kubernetes's source in the module cache, downloaded
// through the module proxy when missing.
func (b *builder) k8sSource(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE: %v (is Go installed and in PATH?)", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "k8s.io", "kubernetes@"+b.k8sVersion)
	if _, err := os.Stat(filepath.Join(dir, "test", "utils", "image", "manifest.go")); err == nil {
		return dir, nil
	}
	b.logf("go mod download k8s.io/kubernetes@%s", b.k8sVersion)
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "k8s.io/kubernetes@"+b.k8sVersion)
	cmd.Dir = b.module
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go mod download k8s.io/kubernetes@%s: %v (is the Go module proxy reachable?)\n%s", b.k8sVersion, err, out)
	}
	return dir, nil
}
