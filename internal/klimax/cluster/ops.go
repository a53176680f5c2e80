package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

// Timeouts of the day-2 commands.
const (
	KindLoadTimeout   = 10 * time.Minute
	KindExportTimeout = 5 * time.Minute
	// DefaultStartWait bounds how long `cluster start` waits for the API,
	// the nodes and kube-system pods.
	DefaultStartWait = 3 * time.Minute
)

// node returns the cluster's control-plane container, or an error naming
// the fix when there is no such cluster.
func (m *Manager) node(ctx context.Context, name string) (NodeContainer, error) {
	if err := ValidateName(name); err != nil {
		return NodeContainer{}, err
	}
	existing, err := m.Existing(ctx)
	if err != nil {
		return NodeContainer{}, err
	}
	n, ok := existing[name]
	if !ok {
		return NodeContainer{}, fmt.Errorf("%w: %s (see klimax cluster list)", ErrNotFound, name)
	}
	return n, nil
}

func (m *Manager) requireRunning(ctx context.Context, name string) error {
	n, err := m.node(ctx, name)
	if err != nil {
		return err
	}
	if n.State != "running" {
		return fmt.Errorf("cluster %s is %s (fix: klimax cluster start %s)", name, n.State, name)
	}
	return nil
}

// Stop stops every node container of the cluster (workers first); the
// cluster keeps its slot, files and state and `Start` brings it back. It
// returns the containers it stopped.
func (m *Manager) Stop(ctx context.Context, name string) ([]string, error) {
	if _, err := m.node(ctx, name); err != nil {
		return nil, err
	}
	nodes, err := m.Inventory.Nodes(ctx, name)
	if err != nil {
		return nil, err
	}
	var running []string
	for i := len(nodes) - 1; i >= 0; i-- { // workers before the control plane
		if nodes[i].State == "running" {
			running = append(running, nodes[i].Container)
		}
	}
	if len(running) == 0 {
		return nil, nil
	}
	err = m.step(fmt.Sprintf("[%s] stop %d node container(s)", name, len(running)), func() error {
		return m.Inventory.StopNodes(ctx, running)
	})
	return running, err
}

// Start starts every node container of the cluster (control plane first)
// and waits up to wait (DefaultStartWait when 0) until the API answers and
// every node and kube-system pod is Ready.
func (m *Manager) Start(ctx context.Context, name string, wait time.Duration) error {
	if _, err := m.node(ctx, name); err != nil {
		return err
	}
	if wait <= 0 {
		wait = DefaultStartWait
	}
	nodes, err := m.Inventory.Nodes(ctx, name)
	if err != nil {
		return err
	}
	var stopped []string
	for _, n := range nodes {
		if n.State != "running" {
			stopped = append(stopped, n.Container)
		}
	}
	prefix := fmt.Sprintf("[%s] ", name)
	if len(stopped) > 0 {
		if err := m.step(prefix+fmt.Sprintf("start %d node container(s)", len(stopped)), func() error {
			return m.Inventory.StartNodes(ctx, stopped)
		}); err != nil {
			return err
		}
	}
	return m.step(prefix+fmt.Sprintf("wait up to %s for the API, nodes and kube-system pods", wait), func() error {
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		kc, err := m.Kubeconfig(wctx, name)
		if err != nil {
			return err
		}
		kube, err := m.NewKube(kc)
		if err != nil {
			return err
		}
		if err := kube.WaitReady(wctx); err != nil {
			return fmt.Errorf("cluster %s started but is not ready after %s: %w (collect logs with klimax cluster logs %s)", name, wait, err, name)
		}
		return nil
	})
}

// ValidateImage checks an image reference given to `cluster load`: a valid
// reference that cannot be taken for a flag by kind.
func ValidateImage(ref string) error {
	if ref == "" || strings.HasPrefix(ref, "-") {
		return fmt.Errorf("image %q: not an image reference (fix: name it like nginx:1.27 or example.com/app:dev)", ref)
	}
	if _, err := name.ParseReference(ref); err != nil {
		return fmt.Errorf("image %q: %v (fix: name it like nginx:1.27 or example.com/app:dev)", ref, err)
	}
	return nil
}

// Load copies images from the machine's Docker engine into every node of
// the cluster (`kind load docker-image`), so pods use them without a pull.
func (m *Manager) Load(ctx context.Context, name string, images []string) error {
	if len(images) == 0 {
		return errors.New("no image given (usage: klimax cluster load <name> <image>...)")
	}
	for _, img := range images {
		if err := ValidateImage(img); err != nil {
			return err
		}
	}
	if err := m.requireRunning(ctx, name); err != nil {
		return err
	}
	if m.ImageExists != nil {
		var missing []string
		for _, img := range images {
			ok, err := m.ImageExists(ctx, img)
			if err != nil {
				return err
			}
			if !ok {
				missing = append(missing, img)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("image(s) %s not in the machine's Docker engine (fix: docker pull or docker build them there first, e.g. with eval $(klimax docker-env))", strings.Join(missing, ", "))
		}
	}
	return m.step(fmt.Sprintf("[%s] kind load docker-image %s", name, strings.Join(images, " ")), func() error {
		argv := append([]string{"kind", "load", "docker-image", "--name", name}, images...)
		_, err := m.run(ctx, KindLoadTimeout, nil, argv...)
		return err
	})
}

// Logs exports the cluster's node and component logs (`kind export logs`)
// into dir on this host and returns it; dir "" means
// ./klimax-logs-<name>-<UTC time>. In a VM kind writes into a guest
// directory that is streamed back as a tar and removed.
func (m *Manager) Logs(ctx context.Context, name, dir string) (string, error) {
	if err := m.requireRunning(ctx, name); err != nil {
		return "", err
	}
	stamp := time.Now().UTC().Format("20060102-150405")
	if dir == "" {
		dir = fmt.Sprintf("klimax-logs-%s-%s", name, stamp)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if entries, err := os.ReadDir(abs); err == nil && len(entries) > 0 {
		return "", fmt.Errorf("logs directory %s is not empty (fix: name a new or empty directory)", abs)
	}
	err = m.step(fmt.Sprintf("[%s] kind export logs %s", name, abs), func() error {
		if m.LocalMachine {
			if err := os.MkdirAll(abs, 0o755); err != nil {
				return err
			}
			_, err := m.run(ctx, KindExportTimeout, nil, "kind", "export", "logs", abs, "--name", name)
			return err
		}
		guestDir := "/tmp/klimax-logs-" + name + "-" + stamp
		defer m.run(context.WithoutCancel(ctx), ShortTimeout, nil, "rm", "-rf", "--", guestDir)
		if _, err := m.run(ctx, KindExportTimeout, nil, "kind", "export", "logs", guestDir, "--name", name); err != nil {
			return err
		}
		out, err := m.run(ctx, KindExportTimeout, nil, "tar", "-C", guestDir, "-cf", "-", ".")
		if err != nil {
			return err
		}
		return untar(bytes.NewReader(out), abs)
	})
	if err != nil {
		return "", err
	}
	return abs, nil
}

// untar extracts regular files and directories under dir, refusing any
// entry that would land outside it.
func untar(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("logs archive: %w", err)
		}
		rel := filepath.Clean(h.Name)
		if filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return fmt.Errorf("logs archive: entry %q outside the directory", h.Name)
		}
		target := filepath.Join(dir, rel)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}

// Owned reports whether klimax created the cluster of n, for the commands
// that act on every cluster (destroy, down on a host, where the user's own
// kind clusters share the engine). klimax's clusters publish their API on a
// slot port, and their control-plane node carries klimax.dev/managed-by;
// for a running cluster the label is checked, so a user's cluster that
// happens to use a port in 7001-7099 is not taken for klimax's, and when
// the API does not answer the error says so and the cluster counts as not
// klimax's (only what klimax made may go). A stopped cluster is judged by
// its port.
func (m *Manager) Owned(ctx context.Context, n NodeContainer) (bool, error) {
	if _, ok := n.Slot(); !ok {
		return false, nil
	}
	if n.State != "running" {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	unsure := func(err error) (bool, error) {
		return false, fmt.Errorf("cluster %s: its API does not answer, so klimax cannot tell whether it made it (%v); if it did, remove it with klimax cluster delete %s", n.Cluster, err, n.Cluster)
	}
	kc, err := m.kubeconfig(ctx, n.Cluster, false)
	if err != nil {
		return unsure(err)
	}
	kube, err := m.NewKube(kc)
	if err != nil {
		return unsure(err)
	}
	l, err := kube.NodeLabels(ctx)
	if err != nil {
		return unsure(err)
	}
	return l[LabelManagedBy] == ManagedByValue, nil
}
