package server

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
)

// RemoveNetwork takes the node's pod network off the machine for good
// (`k3sm uninstall`): every pod's link and namespace, the bridge, the
// routes and the nft tables, then the state file. It serves nothing and
// needs no running netd; the pods' processes must be gone already. It
// returns how many pods it removed.
func RemoveNetwork(cfg Config) (int, error) {
	if !filepath.IsAbs(cfg.StateFile) || !filepath.IsAbs(cfg.NetNSDir) {
		return 0, fmt.Errorf("netd: stateFile and netnsDir must be absolute paths (got %q, %q)", cfg.StateFile, cfg.NetNSDir)
	}
	cidr, _, rs, pods, _, err := loadState(cfg.StateFile)
	if err != nil {
		return 0, fmt.Errorf("netd: %w", err)
	}
	if !cidr.IsValid() { // never configured: nothing on the system is ours
		return 0, removeState(cfg.StateFile)
	}
	dp, err := cfg.NewDataplane()
	if err != nil {
		return 0, fmt.Errorf("netd: dataplane: %w", err)
	}
	// Errors are returned; removal makes no log of its own.
	s := &Server{cfg: cfg, log: slog.New(slog.DiscardHandler), dp: dp, cidr: cidr, rs: rs, pods: pods}
	var errs []error
	removed := 0
	for _, p := range sortedPods(pods) {
		if err := dp.DelPod(s.dpPod(p)); err != nil {
			errs = append(errs, fmt.Errorf("pod %s/%s: %w", p.namespace, p.name, err))
			continue
		}
		removed++
	}
	// What a crash left unrecorded: our links and namespace files.
	if inv, err := dp.Inventory(s.node()); err == nil {
		errs = append(errs, s.removeUnclaimed(inv)...)
	}
	// The mesh device went with netd; its rules stay until removed.
	if mp, ok := dp.(dataplane.MeshPlane); ok {
		if err := mp.DelMesh(s.node()); err != nil {
			errs = append(errs, err)
		}
	}
	if err := dp.DelNode(s.node()); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		// The state stays, so a second run retries what failed.
		return removed, fmt.Errorf("netd: removing the pod network: %w", errors.Join(errs...))
	}
	return removed, removeState(cfg.StateFile)
}

func removeState(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
