package architecture

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/k3sm-dev/k3sm/"

// Where each part of the tree lives.
var (
	serverSide = []string{"internal/server", "internal/upstream"}
	agentSide  = []string{"internal/agent", "internal/runtime", "internal/netd"}
	shared     = []string{"internal/datadir", "internal/roleconfig", "internal/supervisor", "internal/pki",
		"internal/atomicfile", "internal/kubeconfig", "internal/version", "internal/diskpolicy", "internal/units", "internal/syserr", "internal/backoff", "internal/tartree", "api/runtime/v1", "api/join/v1", "api/net/v1"}
)

type pkg struct {
	ImportPath string
	Imports    []string // direct
	Deps       []string // transitive, from `go list -deps`
	Standard   bool
}

// list runs `go list -json -deps` on patterns (from the module root) and
// returns every package it names by import path.
func list(t *testing.T, patterns ...string) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Imports,Deps,Standard", "-deps"}, patterns...)...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = p
	}
	return pkgs
}

func under(path string, dirs []string) bool {
	rel, ok := strings.CutPrefix(path, module)
	if !ok {
		return false
	}
	for _, d := range dirs {
		if rel == d || strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}

// violations lists, for each package of the module under from, the
// dependencies that forbidden reports.
func violations(pkgs map[string]pkg, from []string, forbidden func(dep string) bool) []string {
	var out []string
	for path, p := range pkgs {
		if !under(path, from) {
			continue
		}
		for _, d := range p.Deps {
			if forbidden(d) {
				out = append(out, fmt.Sprintf("%s imports %s", strings.TrimPrefix(path, module), d))
			}
		}
	}
	return out
}

func TestAgentDoesNotImportServer(t *testing.T) {
	pkgs := list(t, "./internal/...")
	if v := violations(pkgs, agentSide, func(d string) bool { return under(d, serverSide) }); len(v) > 0 {
		t.Errorf("the agent side must build without the server (a node that joins another server):\n%s", strings.Join(v, "\n"))
	}
	if v := violations(pkgs, shared, func(d string) bool { return under(d, serverSide) || under(d, agentSide) }); len(v) > 0 {
		t.Errorf("shared packages must import neither side:\n%s", strings.Join(v, "\n"))
	}
}

// Only internal/upstream links the upstream commands and kine into a
// binary (minutes of link time, and megabytes of code nothing else needs).
// Test helpers may use them (klimax's fake kind runs the kubelet's own
// flag validation).
func TestOnlyUpstreamLinksUpstreamCommands(t *testing.T) {
	var bad []string
	for path, p := range list(t, "./cmd/...") {
		if !strings.HasPrefix(path, module) || under(path, []string{"internal/upstream"}) {
			continue
		}
		for _, d := range p.Imports {
			if strings.HasPrefix(d, "k8s.io/kubernetes/cmd/") || strings.HasPrefix(d, "github.com/k3s-io/kine/") {
				bad = append(bad, strings.TrimPrefix(path, module)+" imports "+d)
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("only internal/upstream may link kube-apiserver, the scheduler, the controller-manager and kine:\n%s", strings.Join(bad, "\n"))
	}
}

// The shim runs once per container, so it must stay small: nothing of
// Kubernetes, gRPC, protobuf or go-containerregistry, and none of k3sm's
// bigger packages. This is the shim's one dependency check.
func TestShimStaysSmall(t *testing.T) {
	pkgs := list(t, "./cmd/k3sm-shim")
	shim := pkgs[module+"cmd/k3sm-shim"]
	if shim.ImportPath == "" {
		t.Fatal("cmd/k3sm-shim not listed")
	}
	allowed := []string{"internal/runtime/shim", "internal/runtime/criolog", "internal/runtime/mounts", "internal/runtime/procgroup", "internal/runtime/sandbox",
		"internal/atomicfile", // os and path/filepath only: exit.json and the pid file
	}
	// github.com/creack/pty is dependency-free: it opens the terminal of a
	// tty: true container.
	for _, d := range shim.Deps {
		switch {
		case strings.HasPrefix(d, module+"internal/runtime/sandbox/"):
			// The profile compilers (seccomp's moby data, Seatbelt) are
			// the daemon's; the shim only loads what they made.
			t.Errorf("k3sm-shim links %s: only the daemon compiles sandbox profiles", d)
		case pkgs[d].Standard, strings.HasPrefix(d, "vendor/"), strings.HasPrefix(d, "golang.org/x/sys/"), d == "github.com/creack/pty":
		case strings.HasPrefix(d, module) && under(d, allowed):
		default:
			t.Errorf("k3sm-shim links %s: the shim may use only the standard library, x/sys, pty and %v", d, allowed)
		}
	}
}

// k3sm-netd runs as root, so it links as little as it can: the standard
// library, x/sys, the data path's netlink and nftables libraries (and
// their own dependencies), wireguard-go for the mesh, and a few small k3sm
// packages. Nothing of Kubernetes, gRPC or protobuf.
func TestNetdStaysSmall(t *testing.T) {
	pkgs := list(t, "./cmd/k3sm-netd")
	netd := pkgs[module+"cmd/k3sm-netd"]
	if netd.ImportPath == "" {
		t.Fatal("cmd/k3sm-netd not listed")
	}
	allowed := []string{"internal/netd", "internal/roleconfig/netdconfig", "internal/atomicfile", "internal/datadir"}
	thirdParty := []string{"golang.org/x/sys/", "golang.org/x/net/", "golang.org/x/sync/",
		"github.com/vishvananda/netlink", "github.com/vishvananda/netns", "github.com/google/nftables",
		"github.com/mdlayher/netlink", "github.com/mdlayher/socket", "github.com/josharian/native",
		// The mesh: wireguard-go's device, tun and conn packages and the
		// x/crypto primitives they use (not wintun, which is Windows').
		"golang.zx2c4.com/wireguard/", "golang.org/x/crypto/"}
	for _, d := range netd.Deps {
		switch {
		case pkgs[d].Standard, strings.HasPrefix(d, "vendor/"):
		case strings.HasPrefix(d, module) && under(d, allowed):
		case slices.ContainsFunc(thirdParty, func(p string) bool { return d == p || strings.HasPrefix(d, strings.TrimSuffix(p, "/")+"/") }):
		default:
			t.Errorf("k3sm-netd links %s: the root helper may use only the standard library, %v and %v", d, thirdParty, allowed)
		}
	}
}

// k3sm-runtimed is a binary of its own so that the runtime daemon, which
// runs as long as the server, does not pay the package initialisation and
// pages of the control plane: it links the runtime packages, gRPC and the
// image libraries, and apimachinery only for resource quantities, but
// nothing of Kubernetes' components, client-go, helm or the server.
func TestRuntimedStaysSmall(t *testing.T) {
	pkgs := list(t, "./cmd/k3sm-runtimed")
	rt := pkgs[module+"cmd/k3sm-runtimed"]
	if !slices.Contains(rt.Deps, module+"internal/runtime/daemon") {
		t.Fatal("cmd/k3sm-runtimed does not link internal/runtime/daemon: is the daemon still where this test looks for it?")
	}
	forbidden := []string{"k8s.io/kubernetes/cmd/", "k8s.io/kubernetes/pkg/", "k8s.io/client-go/", "k8s.io/api/",
		"k8s.io/apiserver/", "k8s.io/component-base/", "k8s.io/kubectl/", "helm.sh/", "go.etcd.io/",
		"github.com/spf13/cobra", "github.com/prometheus/",
		module + "internal/server/", module + "internal/agent/", module + "internal/upstream/", module + "internal/k3smcmd"}
	for _, d := range rt.Deps {
		for _, f := range forbidden {
			if d == strings.TrimSuffix(f, "/") || strings.HasPrefix(d, strings.TrimSuffix(f, "/")+"/") {
				t.Errorf("k3sm-runtimed links %s (under %s): the runtime daemon's binary keeps the control plane out", d, f)
			}
		}
	}
}

// The helm SDK runs in k3sm-helm, a binary of its own: linked into k3sm,
// its package initialisation (~3.5 MB of allocations: jsonschema,
// govalidator, ...) would be paid by every process of the server.
func TestK3smDoesNotLinkHelm(t *testing.T) {
	pkgs := list(t, "./cmd/k3sm", "./cmd/k3sm-helm")
	k3sm := pkgs[module+"cmd/k3sm"]
	if k3sm.ImportPath == "" {
		t.Fatal("cmd/k3sm not listed")
	}
	for _, d := range k3sm.Deps {
		if strings.HasPrefix(d, "helm.sh/helm/") || d == module+"internal/server/deploy/helmop" {
			t.Errorf("k3sm links %s: helm operations belong in k3sm-helm (internal/server/deploy/helmop), reached through internal/server/deploy/helmwire", d)
		}
	}
	// The helper is the one that links it, so the check above looks for
	// the right import path.
	if !slices.ContainsFunc(pkgs[module+"cmd/k3sm-helm"].Deps, func(d string) bool { return strings.HasPrefix(d, "helm.sh/helm/v3/pkg/action") }) {
		t.Error("cmd/k3sm-helm does not link helm.sh/helm/v3/pkg/action: is the helm SDK still where this test looks for it?")
	}
}
