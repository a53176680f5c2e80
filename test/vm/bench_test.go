package vm

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// benchEnv runs the benchmarks that need the guest (a cgroup v2 host);
// they print figures and judge nothing, so CI does not run them.
const benchEnv = "K3SM_VM_BENCH"

// Pod start with the container's init created in its cgroup
// (CLONE_INTO_CGROUP) against moved there after it was created, side by
// side in the guest (bench/runtime TestCgroupBirthCost). The guest runs
// under TCG here: its ratios mean something, its milliseconds do not.
//
//	K3SM_VM_BENCH=1 go test -count=1 -v -run TestBenchCgroupBirth ./test/vm/
func TestBenchCgroupBirth(t *testing.T) {
	if os.Getenv(benchEnv) == "" {
		t.Skip("a benchmark: set " + benchEnv + "=1 to run it")
	}
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var out, errOut strings.Builder
	err := guest.Run(ctx, "systemd-run --wait --pipe --quiet --collect -p Delegate=yes -E K3SM_BENCH_RUNTIME=1 "+
		"-E K3SM_RUNTIME_TEST_SHIM_BIN=/mnt/k3sm/k3sm-shim -E K3SM_RUNTIME_TEST_PROG_BIN=/mnt/k3sm/prog "+
		"/mnt/k3sm/runtimebench.test -test.v -test.count=1 -test.run 'TestCgroupBirthCost$'", &out, &errOut)
	if err != nil || !strings.Contains(out.String(), "born / joined") {
		t.Fatalf("guest: %v\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	t.Logf("in the guest (%s):\n%s", guest.Accel, out.String())
}
