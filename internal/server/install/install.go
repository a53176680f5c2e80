package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/roleconfig/netdconfig"
)

// Options say what to install where. The zero values of the paths are the
// fixed locations; tests point them into a temporary root.
type Options struct {
	// Role is RoleServer ("" too) or RoleAgent: `k3sm server` or `k3sm
	// agent` in the service.
	Role string
	// NodeName is the agent's node (what its readiness waits for).
	NodeName string
	// DisableAgent: the server runs no node (--disable-agent), so its
	// readiness waits for no Node.
	DisableAgent bool
	// DataDir is the server's (or agent's) data dir (absolute).
	DataDir string
	// ServerArgs are the role's flags persisted in the unit, after
	// `server --data-dir DataDir` (or `agent ...`).
	ServerArgs []string
	// Environment (KEY=VALUE) is given to the server but kept out of its
	// unit, which anyone may read: secrets such as the password in
	// --datastore-endpoint (K3SM_DATASTORE_ENDPOINT) go to a file only root
	// reads (systemd's EnvironmentFile; launchd's plist, then 0600).
	Environment []string
	// Source is the directory holding the binaries to install.
	Source string
	// Version goes into the units' header and the manifest.
	Version string
	// LibDir, BinLink, UnitDir, ManifestPath, LogDir: "" is the default.
	LibDir, BinLink, UnitDir, ManifestPath, LogDir string
	// NoBinLink skips the link on $PATH.
	NoBinLink bool
	// DataVolume (darwin) is an APFS volume mounted at DataDir at boot.
	DataVolume string
	// Kubeconfig is where the admin kubeconfig is merged ("" skips it);
	// UID/GID own it and any directory made for it.
	Kubeconfig         string
	KubeconfigUID, GID int
	// Timeout bounds the wait for the cluster (0: no wait).
	Timeout time.Duration
	Out     io.Writer
	Runner  Runner
	// Ready waits until the cluster answers; nil skips the wait.
	Ready func(ctx context.Context, o Options, progress func(string)) error
}

func (o Options) libDir() string { return or(o.LibDir, LibDir) }

// role is RoleServer or RoleAgent.
func (o Options) role() string { return or(o.Role, RoleServer) }
func (o Options) binLink() string {
	if o.NoBinLink {
		return ""
	}
	return or(o.BinLink, BinLink)
}
func (o Options) unitDir(def string) string { return or(o.UnitDir, def) }
func (o Options) manifestPath() string      { return or(o.ManifestPath, ManifestPath) }

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Manifest records what install made, so that uninstall removes exactly that.
type Manifest struct {
	Version string `json:"version"`
	Service string `json:"service"`
	// Role is what the service runs; "" (manifests before agents) is
	// RoleServer.
	Role    string `json:"role,omitempty"`
	DataDir string `json:"dataDir"`
	// Created lists files, links and directories install created (a
	// directory only when it did not exist before), in creation order.
	Created []Entry `json:"created"`
	// Kubeconfigs are the files install merged the admin kubeconfig into.
	Kubeconfigs []KubeconfigEntry `json:"kubeconfigs,omitempty"`
	// CreatedUser: install created the service user (_k3sm on darwin,
	// k3sm on Linux).
	CreatedUser bool `json:"createdUser,omitempty"`
	// AddedSubIDs: install gave an existing k3sm user its subordinate
	// range (Linux).
	AddedSubIDs bool `json:"addedSubIDs,omitempty"`
}

// Entry is one created path.
type Entry struct {
	Path string `json:"path"`
	Kind string `json:"kind"` // file, link, dir
}

// KubeconfigEntry is a kubeconfig install merged contexts into.
type KubeconfigEntry struct {
	Path     string   `json:"path"`
	Contexts []string `json:"contexts"`
	// Created: the file did not exist before install (removed when empty).
	Created bool `json:"created,omitempty"`
}

func (m *Manifest) add(path, kind string) {
	if !slices.ContainsFunc(m.Created, func(e Entry) bool { return e.Path == path }) {
		m.Created = append(m.Created, Entry{Path: path, Kind: kind})
	}
}

// ReadManifest reads the manifest at path; (nil, nil) when absent.
func ReadManifest(path string) (*Manifest, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w (remove it and the units by hand, or re-run `k3sm install`)", path, err)
	}
	return &m, nil
}

func writeManifest(path string, m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, append(b, '\n'), 0o644)
}

// mkdirAll makes dir and its missing parents, recording each one it made.
func mkdirAll(m *Manifest, dir string, mode os.FileMode) error {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	for i := len(missing) - 1; i >= 0; i-- {
		m.add(missing[i], "dir")
	}
	return nil
}

// writeIfChanged writes data atomically unless path holds it already, and
// reports whether it wrote.
func writeIfChanged(m *Manifest, path string, data []byte, mode os.FileMode) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm() == mode {
			m.add(path, "file")
			return false, nil
		}
	}
	if err := mkdirAll(m, filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	if err := atomicfile.WriteFile(path, data, mode); err != nil {
		return false, err
	}
	m.add(path, "file")
	return true, nil
}

func fileSum(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// copyBinary copies src to dst (atomically: a running server keeps its old
// file) unless they are equal, and reports whether it copied.
func copyBinary(m *Manifest, src, dst string) (bool, error) {
	ss, err := fileSum(src)
	if err != nil {
		return false, fmt.Errorf("binary to install: %w (build it: make bin/k3sm bin/k3sm-runtimed bin/k3sm-shim bin/k3sm-netd bin/k3sm-helm)", err)
	}
	m.add(dst, "file")
	if ds, err := fileSum(dst); err == nil && bytes.Equal(ss, ds) {
		return false, nil
	}
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	return true, os.Rename(tmp.Name(), dst)
}

// Install copies the binaries, writes the units, starts them, waits for
// the cluster and merges the admin kubeconfig. It is idempotent: a second
// run updates what changed and restarts the server only then.
func Install(ctx context.Context, svc Service, o Options) error {
	say := func(format string, a ...any) { fmt.Fprintf(o.Out, format+"\n", a...) }
	prev, err := ReadManifest(o.manifestPath())
	if err != nil {
		return err
	}
	m := &Manifest{}
	if prev != nil {
		if r := or(prev.Role, RoleServer); r != o.role() {
			return fmt.Errorf("this machine runs an installed k3sm %s: run `k3sm uninstall` first to install k3sm %s here (a machine is one node of one cluster)", r, o.role())
		}
		if prev.DataDir != o.DataDir {
			return fmt.Errorf("k3sm is installed with --data-dir %s: pass --data-dir %s to update it, or run `k3sm uninstall` first", prev.DataDir, prev.DataDir)
		}
		m = prev
	}
	m.Version, m.Service, m.DataDir = o.Version, svc.Name(), o.DataDir
	if o.role() == RoleAgent {
		m.Role = RoleAgent
	}

	// The manifest is written before anything else and after every step,
	// so that an install cut short can still be uninstalled.
	if err := mkdirAll(m, filepath.Dir(o.manifestPath()), 0o755); err != nil {
		return err
	}
	save := func() error { return writeManifest(o.manifestPath(), m) }
	if err := save(); err != nil {
		return err
	}
	m.add(o.manifestPath(), "file")
	defer save() // also when a step fails: what it made is uninstalled

	changed := false
	if err := mkdirAll(m, o.libDir(), 0o755); err != nil {
		return err
	}
	for _, b := range Binaries {
		c, err := copyBinary(m, filepath.Join(o.Source, b), filepath.Join(o.libDir(), b))
		if err != nil {
			return err
		}
		if c {
			say("installed %s", filepath.Join(o.libDir(), b))
		}
		changed = changed || c
	}
	if link := o.binLink(); link != "" {
		target := filepath.Join(o.libDir(), binK3sm)
		if cur, err := os.Readlink(link); err == nil && cur == target {
			m.add(link, "link")
		} else if _, err := os.Lstat(link); err == nil {
			return fmt.Errorf("%s exists and is not a link to %s: move it away (k3sm install links it there), or pass --bin-link=false", link, target)
		} else {
			if err := mkdirAll(m, filepath.Dir(link), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(target, link); err != nil {
				return err
			}
			m.add(link, "link")
			say("linked %s -> %s", link, target)
		}
	}
	units, err := svc.Units(o)
	if err != nil {
		return err
	}
	for _, u := range units {
		c, err := writeIfChanged(m, u.Path, u.Content, os.FileMode(u.Mode))
		if err != nil {
			return err
		}
		if c {
			say("wrote %s", u.Path)
		}
		changed = changed || c
	}
	if l, ok := svc.(Launchd); ok && !l.UserExists {
		m.CreatedUser = true
	}
	if sd, ok := svc.(Systemd); ok {
		m.CreatedUser = m.CreatedUser || !sd.UserExists
		m.AddedSubIDs = m.AddedSubIDs || (sd.UserExists && sd.AddSubIDs)
	}
	if err := save(); err != nil {
		return err
	}
	if _, err := os.Stat(datadir.New(o.DataDir).DBFile()); err == nil && slices.Contains(o.ServerArgs, "--secrets-encryption") {
		if _, err := os.Stat(datadir.New(o.DataDir).EncryptionConfig()); err != nil {
			say("note: %s already holds a cluster created without --secrets-encryption: the flag takes effect only on the start that creates a cluster, so its Secrets stay unencrypted (see docs/operations.md)", o.DataDir)
		}
	}
	for _, c := range append(svc.Setup(o), svc.Start(o, changed)...) {
		if err := run(ctx, o, c); err != nil {
			return err
		}
	}
	if o.Ready != nil {
		what := "the cluster"
		if o.role() == RoleAgent {
			what = "this node to join and be Ready"
		}
		say("waiting for %s (up to %s)...", what, o.Timeout)
		wctx, cancel := context.WithTimeout(ctx, o.Timeout)
		err := o.Ready(wctx, o, func(s string) { say("  %s", s) })
		cancel()
		if err != nil {
			return fmt.Errorf("%w; the service stays installed: see %s, fix and re-run `k3sm install`, or `k3sm uninstall`", err, svc.LogHint(o))
		}
	}
	if o.Kubeconfig != "" {
		if err := mergeKubeconfig(m, o); err != nil {
			return err
		}
		if err := save(); err != nil {
			return err
		}
		say("merged context %q into %s", "k3sm", o.Kubeconfig)
	}
	say("k3sm %s is installed (%s); `k3sm uninstall` removes it", o.role(), svc.Name())
	return nil
}

// mergeKubeconfig merges the admin kubeconfig into o.Kubeconfig, owned by
// the invoking user, and records the contexts it added.
func mergeKubeconfig(m *Manifest, o Options) error {
	admin, err := os.ReadFile(datadir.New(o.DataDir).AdminKubeconfig())
	if err != nil {
		return fmt.Errorf("admin kubeconfig: %w (is the server up? see `k3sm status`)", err)
	}
	ctxs, err := kubeconfig.ContextNames(admin)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(m.Kubeconfigs, func(k KubeconfigEntry) bool { return k.Path == o.Kubeconfig })
	if i < 0 {
		_, statErr := os.Stat(o.Kubeconfig)
		m.Kubeconfigs = append(m.Kubeconfigs, KubeconfigEntry{Path: o.Kubeconfig, Created: errors.Is(statErr, os.ErrNotExist)})
		i = len(m.Kubeconfigs) - 1
	}
	dir := filepath.Dir(o.Kubeconfig)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		m.add(dir, "dir")
		if err := os.Chown(dir, o.KubeconfigUID, o.GID); err != nil {
			return err
		}
	}
	if _, err := kubeconfig.Merge(o.Kubeconfig, admin, kubeconfig.MergeOptions{SetCurrentContext: true}); err != nil {
		return err
	}
	for _, c := range ctxs {
		if !slices.Contains(m.Kubeconfigs[i].Contexts, c) {
			m.Kubeconfigs[i].Contexts = append(m.Kubeconfigs[i].Contexts, c)
		}
	}
	for _, p := range []string{o.Kubeconfig, kubeconfig.BackupPath(o.Kubeconfig)} {
		if _, err := os.Stat(p); err == nil {
			if err := os.Chown(p, o.KubeconfigUID, o.GID); err != nil {
				return err
			}
		}
	}
	return nil
}

// run runs one command; a leading "-" marks one whose failure is expected
// at times and only reported.
func run(ctx context.Context, o Options, argv []string) error {
	ignore := argv[0] == "-"
	if ignore {
		argv = argv[1:]
	}
	if _, err := o.Runner.Run(ctx, argv); err != nil {
		if ignore {
			return nil
		}
		return err
	}
	return nil
}

// UninstallOptions tune Uninstall.
type UninstallOptions struct {
	// Purge removes the data dir too.
	Purge bool
	// StopGrace is how long the pods get after SIGTERM before SIGKILL.
	StopGrace time.Duration
}

// Uninstall stops the service and the pods, and removes what the manifest
// lists: units, binaries, the link, kubeconfig contexts, then (Purge) the
// data dir.
func Uninstall(ctx context.Context, svc Service, o Options, u UninstallOptions) error {
	say := func(format string, a ...any) { fmt.Fprintf(o.Out, format+"\n", a...) }
	m, err := ReadManifest(o.manifestPath())
	if err != nil {
		return err
	}
	if m == nil {
		return fmt.Errorf("k3sm is not installed: %s is missing (nothing to uninstall; a cluster run by hand stops with Ctrl-C)", o.manifestPath())
	}
	o.DataDir, o.Role = m.DataDir, or(m.Role, RoleServer)
	for _, c := range svc.Stop(o) {
		if _, err := o.Runner.Run(ctx, c); err != nil {
			say("warning: %v", err)
		}
	}
	// The pods: SIGTERM, StopGrace, then SIGKILL for what is left.
	unit := svc.UnitName(o)
	leftovers := leftoverProcesses(unit)
	for _, pid := range leftovers {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	for deadline := time.Now().Add(u.StopGrace); len(leftovers) > 0 && time.Now().Before(deadline); leftovers = leftoverProcesses(unit) {
		time.Sleep(200 * time.Millisecond)
	}
	for _, pid := range leftovers {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if len(leftovers) > 0 {
		say("killed %d pod processes that outlived SIGTERM", len(leftovers))
	}
	say("stopped k3sm %s", o.Role)
	removePodNetwork(ctx, o, say)

	for _, k := range m.Kubeconfigs {
		if err := kubeconfig.Remove(k.Path, k.Contexts); err != nil {
			say("warning: %s: %v", k.Path, err)
			continue
		}
		say("removed context(s) %s from %s", strings.Join(k.Contexts, ", "), k.Path)
		if k.Created && kubeconfigEmpty(k.Path) {
			os.Remove(k.Path)
			os.Remove(kubeconfig.BackupPath(k.Path))
		}
	}
	for i := len(m.Created) - 1; i >= 0; i-- {
		e := m.Created[i]
		var err error
		if e.Kind == "dir" {
			err = os.Remove(e.Path) // only when empty: something else may live there now
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				say("kept %s (not empty)", e.Path)
				continue
			}
		} else {
			err = os.Remove(e.Path)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", e.Path, err)
		}
		if err == nil {
			say("removed %s", e.Path)
		}
	}
	for _, c := range svc.Teardown(o, m) {
		if c[0] == "-" {
			_ = run(ctx, o, c)
		} else if _, err := o.Runner.Run(ctx, c); err != nil {
			say("warning: %v", err)
		}
	}
	if u.Purge {
		if err := purge(m.DataDir); err != nil {
			return err
		}
		say("removed the data dir %s", m.DataDir)
	} else {
		again := "`k3sm install --data-dir " + m.DataDir + "` brings the cluster back"
		if o.Role == RoleAgent {
			again = "`k3sm install --agent --data-dir " + m.DataDir + " ...` joins this node again"
		}
		say("kept the data dir %s (`k3sm uninstall --purge` removes it; %s)", m.DataDir, again)
	}
	return nil
}

// removePodNetwork has the installed k3sm-netd take the pod network off the
// machine (its bridge, routes, nft tables and the pods' links and
// namespaces), when netd ever ran on this data dir. The pods are stopped
// by then; a netd that is still serving holds nothing removal needs.
func removePodNetwork(ctx context.Context, o Options, say func(string, ...any)) {
	bin := filepath.Join(o.libDir(), "k3sm-netd")
	// The installed netd's own configuration (Linux): its state and
	// namespaces are outside the data dir.
	if cfgPath, stateDir, _ := netdPaths(o); fileExists(cfgPath) {
		cfg, err := netdconfig.Read([]string{"--config=" + cfgPath})
		if err != nil {
			say("warning: the pod network is left on the machine: %v", err)
			return
		}
		if !fileExists(cfg.StateFile) {
			return
		}
		out, err := o.Runner.Run(ctx, []string{bin, "remove", "--config=" + cfgPath})
		if err != nil {
			say("warning: the pod network is left on the machine: %v (run `k3sm uninstall` again to retry)", err)
			return
		}
		say("%s", strings.TrimSpace(out))
		if filepath.Dir(cfg.StateFile) == stateDir {
			os.RemoveAll(stateDir) // netd's own
		}
		return
	}
	l := datadir.New(o.DataDir)
	if _, err := os.Stat(l.NetdStateFile()); err != nil {
		return // never ran, or the network is already gone
	}
	if _, err := os.Stat(bin); err != nil {
		say("warning: the pod network is left on the machine: %s is missing (reinstall and uninstall again, or remove the %s bridge and the nft tables k3sm and k3sm-* by hand)", bin, "k3sm0")
		return
	}
	dir, err := os.MkdirTemp("", "k3sm-uninstall-")
	if err != nil {
		say("warning: the pod network is left on the machine: %v", err)
		return
	}
	defer os.RemoveAll(dir)
	args, err := roleconfig.Write(filepath.Join(dir, "netd.json"), roleconfig.NetdConfig{
		Socket: l.NetdSocket(), StateFile: l.NetdStateFile(), NetNSDir: l.NetNSDir(), AllowedUID: os.Geteuid()})
	if err != nil {
		say("warning: the pod network is left on the machine: %v", err)
		return
	}
	out, err := o.Runner.Run(ctx, append([]string{bin, "remove"}, args...))
	if err != nil {
		say("warning: the pod network is left on the machine: %v (run `k3sm uninstall` again to retry)", err)
		return
	}
	say("%s", strings.TrimSpace(out))
}

func kubeconfigEmpty(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	names, err := kubeconfig.ContextNames(b)
	return err == nil && len(names) == 0
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
