// Package vm runs k3sm on the host most users have, in the test VM
// (internal/testutil/vmtest): systemd as PID 1 on the unified cgroup v2
// hierarchy, which this build machine (cgroup v1) is not. TestMain builds
// the binaries the guest runs, shares them in and boots one guest for the
// package; each test runs its part over ssh.
//
// Where no VM can run (not root, QEMU missing) every test skips and says
// why, unless K3SM_REQUIRE_VM is set (.ci/run sets it): then that is a
// failure, so CI never passes with the stage skipped.
package vm

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	"github.com/k3sm-dev/k3sm/internal/testutil/vmtest"
)

var (
	guest   *vmtest.VM
	skipWhy string
	// binSkip says why the k3sm binaries are not in the guest ("" when
	// they are, in /mnt/k3sm/bin).
	binSkip string
)

// k3smBinaries are what `k3sm install` installs, from beside $K3SM_BIN.
var k3smBinaries = []string{"k3sm", "k3sm-runtimed", "k3sm-shim", "k3sm-netd", "k3sm-helm"}

// testBinaries are the packages whose tests run in the guest, compiled
// here (the guest has no Go): name in the share -> package.
var testBinaries = map[string]string{
	"cgroups.test": "./internal/runtime/cgroups",
	"daemon.test":  "./internal/runtime/daemon",
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if skipWhy = vmtest.Unavailable(); skipWhy != "" {
		return m.Run()
	}
	ctx := context.Background()
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	t0 := time.Now()
	img, err := vmtest.Build(ctx, logf)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	work, err := os.MkdirTemp("", "k3sm-vm")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(work)
	share := filepath.Join(work, "share")
	if err := buildShare(ctx, share); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	t1 := time.Now()
	// The server and its pods want more than the 2 GiB default.
	guest, err = vmtest.Boot(ctx, img, vmtest.Options{Share: share, Work: work, MemoryMB: 3072})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer guest.Stop()
	// What the stage runs on, first: the kernel and the cgroup filesystem.
	out, err := guest.Output(ctx, "cat /proc/version; stat -fc %T /sys/fs/cgroup; nproc")
	fmt.Fprintf(os.Stderr, "test VM (%s, image %s, binaries ready in %s, booted in %s):\n%s",
		guest.Accel, vmtest.Version(), t1.Sub(t0).Round(time.Second), time.Since(t1).Round(100*time.Millisecond), out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// buildShare compiles the test binaries into dir (static: the guest's
// libc is not this machine's concern).
func buildShare(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	bins := maps.Clone(testBinaries)
	if os.Getenv(benchEnv) != "" {
		bins["runtimebench.test"] = "./bench/runtime"
	}
	for name, pkg := range bins {
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", filepath.Join(dir, name), pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go test -c %s: %w\n%s", pkg, err, out)
		}
	}
	// What daemon.test would build itself (K3SM_RUNTIME_TEST_*_BIN).
	cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "k3sm-shim"), "./cmd/k3sm-shim")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build k3sm-shim: %w\n%s", err, out)
	}
	prog, err := imagetest.BuildProg(filepath.Join(dir, "..", "prog"))
	if err != nil {
		return err
	}
	if err := os.Rename(prog, filepath.Join(dir, "prog")); err != nil {
		return err
	}
	// The real binaries `make` built (make test-vm sets K3SM_BIN).
	k3sm := os.Getenv("K3SM_BIN")
	if k3sm == "" {
		binSkip = "K3SM_BIN is not set: make test-vm builds bin/ and sets it"
		return nil
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return err
	}
	for _, b := range k3smBinaries {
		src := filepath.Join(filepath.Dir(k3sm), b)
		if out, err := exec.CommandContext(ctx, "cp", src, filepath.Join(dir, "bin", b)).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v %s (build it with make bin/%s)", src, err, out, b)
		}
	}
	return nil
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// need skips (or, under K3SM_REQUIRE_VM, fails) a test when no guest runs.
func need(t *testing.T) {
	t.Helper()
	if skipWhy == "" {
		return
	}
	if os.Getenv("K3SM_REQUIRE_VM") != "" {
		t.Fatalf("K3SM_REQUIRE_VM is set, but no test VM can run here: %s", skipWhy)
	}
	t.Skip(skipWhy)
}

// needBinaries is need, and the k3sm binaries in the guest.
func needBinaries(t *testing.T) {
	t.Helper()
	need(t)
	if binSkip != "" {
		if os.Getenv("K3SM_REQUIRE_VM") != "" {
			t.Fatal(binSkip)
		}
		t.Skip(binSkip)
	}
}
