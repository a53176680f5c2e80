package e2e

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Every process of the binary (each child of the server, each `k3sm
// kubectl`) runs the initialisation of every package linked in, so what
// it allocates is paid seven times over. kubectl's translations load only
// in kubectl (internal/upstream/kubectli18n); the whole stays bounded.
func TestKubectlTranslationsOnlyInKubectl(t *testing.T) {
	cmd := exec.Command(k3smBin, "version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("k3sm version: %v\n%s", err, out)
	}
	var total, options int64
	for _, line := range strings.Split(string(out), "\n") {
		// init <pkg> @<t> ms, <clock> ms clock, <bytes> bytes, <n> allocs
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "init" || f[len(f)-3] != "bytes," {
			continue
		}
		n, err := strconv.ParseInt(f[len(f)-4], 10, 64)
		if err != nil {
			t.Fatalf("unexpected inittrace line %q", line)
		}
		total += n
		if f[1] == "k8s.io/kubectl/pkg/cmd/options" {
			options = n
		}
	}
	if total == 0 {
		t.Fatalf("no inittrace output:\n%s", out)
	}
	t.Logf("package initialisation allocates %.1f MiB (kubectl's options package %d bytes)", float64(total)/(1<<20), options)
	if options > 64<<10 {
		t.Errorf("k8s.io/kubectl/pkg/cmd/options allocates %d bytes at init: kubectl's translations are loaded outside kubectl", options)
	}
	// 14.2 MiB when first measured; the helm SDK (HelmChart, issue 15)
	// added 3.4 MiB (jsonschema/v6 through its chartutil, govalidator
	// through its lint rules) until it moved to k3sm-helm: 14.3 MiB on
	// 2026-12-03 (bench/RESULTS.md, issue 17). The bound is there to catch
	// growth nobody measured.
	if total > 15<<20 {
		t.Errorf("package initialisation allocates %.1f MiB in every process (14.3 MiB when measured): find the package that grew", float64(total)/(1<<20))
	}
}
