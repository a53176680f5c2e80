package k3smcmd

import (
	"fmt"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"os"
	"path/filepath"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
)

// kubectlTarget picks the kubeconfig `k3sm kubectl` runs with. It strips a
// leading `--data-dir DIR` (k3sm's flag, unknown to kubectl) from args.
// Precedence: --kubeconfig and $KUBECONFIG (kubectl's own), then the admin
// kubeconfig of --data-dir / $K3SM_DATA_DIR / the default data dir, then
// ~/.kube/config with a note. With none of them it is an error naming the
// file it looked for and the ways to point at a cluster, instead of
// kubectl's silent fallback to localhost:8080.
func kubectlTarget(args []string, getenv func(string) string, home string) (rest []string, kubeconfig, note string, err error) {
	dataDir := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		if a == "--data-dir" {
			if i+1 >= len(args) {
				return nil, "", "", fmt.Errorf("k3sm kubectl: --data-dir needs a directory")
			}
			dataDir = args[i+1]
			i++
			continue
		}
		if v, ok := strings.CutPrefix(a, "--data-dir="); ok {
			dataDir = v
			continue
		}
		rest = append(rest, a)
	}
	if hasKubeconfigFlag(rest) || getenv("KUBECONFIG") != "" {
		if dataDir != "" {
			return nil, "", "", fmt.Errorf("k3sm kubectl: --data-dir and --kubeconfig/$KUBECONFIG both name a cluster; pass one of them")
		}
		return rest, "", "", nil
	}
	source := "--data-dir"
	if dataDir == "" {
		source, dataDir = "$K3SM_DATA_DIR", getenv("K3SM_DATA_DIR")
		if dataDir == "" {
			source, dataDir = "the default data dir", controlplane.DefaultDataDir()
		}
	}
	admin := datadir.New(dataDir).AdminKubeconfig()
	if _, err := os.Stat(admin); err == nil {
		return rest, admin, "", nil
	}
	hint := fmt.Sprintf("no admin kubeconfig at %s (%s %s): start `k3sm server` there, or point at the server: "+
		"`k3sm kubectl --data-dir DIR ...`, K3SM_DATA_DIR=DIR, or --kubeconfig FILE", admin, source, dataDir)
	if source == "--data-dir" {
		return nil, "", "", fmt.Errorf("k3sm kubectl: %s", hint)
	}
	if home != "" {
		if _, err := os.Stat(filepath.Join(home, ".kube", "config")); err == nil {
			return rest, "", "k3sm kubectl: " + hint + "; using ~/.kube/config", nil
		}
	}
	return nil, "", "", fmt.Errorf("k3sm kubectl: %s", hint)
}

func hasKubeconfigFlag(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--kubeconfig" || strings.HasPrefix(a, "--kubeconfig=") {
			return true
		}
	}
	return false
}
