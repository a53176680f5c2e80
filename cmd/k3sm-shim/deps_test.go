package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShimDependencies keeps the per-container shim small: it may link the
// standard library, golang.org/x/sys and this repository's stdlib-only
// runtime packages (and creack/pty), and nothing else (no Kubernetes, no gRPC, no protobuf).
func TestShimDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/k3sm-dev/k3sm/cmd/k3sm-shim").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := []string{
		"github.com/k3sm-dev/k3sm/cmd/k3sm-shim",
		"github.com/k3sm-dev/k3sm/internal/runtime/shim",
		"github.com/k3sm-dev/k3sm/internal/runtime/criolog",
		"github.com/k3sm-dev/k3sm/internal/runtime/mounts",
		"github.com/k3sm-dev/k3sm/internal/runtime/procgroup",
		"github.com/k3sm-dev/k3sm/internal/runtime/sandbox",
		"github.com/k3sm-dev/k3sm/internal/atomicfile", // os and path/filepath only: exit.json and the pid file
		"golang.org/x/sys/",
		"github.com/creack/pty", // dependency-free: opens the terminal of a tty: true container
		"vendor/",               // the standard library's vendored packages
	}
	banned := []string{"k8s.io/", "sigs.k8s.io/", "google.golang.org/grpc", "google.golang.org/protobuf", "github.com/google/go-containerregistry"}
	for _, dep := range strings.Fields(string(out)) {
		for _, b := range banned {
			if strings.HasPrefix(dep, b) {
				t.Errorf("k3sm-shim links banned package %s", dep)
			}
		}
		first := strings.SplitN(dep, "/", 2)[0]
		if !strings.Contains(first, ".") {
			continue // standard library
		}
		ok := false
		for _, a := range allowed {
			if dep == a || strings.HasPrefix(dep, a) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("k3sm-shim links %s: the shim may only use the standard library and its own stdlib-only packages", dep)
		}
	}
}
