package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/slot"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
)

// Progress reports long steps; Step returns the function that ends the step.
type Progress interface {
	Step(title string) (done func(err error))
}

type noProgress struct{}

func (noProgress) Step(string) func(error) { return func(error) {} }

// Timeouts for guest commands.
const (
	KindCreateTimeout = 15 * time.Minute
	KindDeleteTimeout = 5 * time.Minute
	ShortTimeout      = 1 * time.Minute
	// SetupTimeout bounds MetalLB/CoreDNS/addon setup after kind returns.
	SetupTimeout = 5 * time.Minute
)

// Manager creates, deletes, lists and labels clusters.
type Manager struct {
	Config *config.Config
	// Runner runs kind and docker in the machine (VM guest or local host).
	Runner vm.Runner
	// Inventory lists existing kind clusters.
	Inventory Inventory
	// APIHost returns the address kubeconfigs use (lima0 IP, or 127.0.0.1).
	APIHost func(ctx context.Context) (string, error)
	// ListenAddress is where kind publishes API ports in the machine.
	ListenAddress string
	// NewKube connects to a cluster from its kubeconfig.
	NewKube func(kubeconfig []byte) (Kube, error)
	// Manifests supplies pinned upstream manifests (MetalLB, metrics-server).
	Manifests *Manifests
	// KubeDir holds per-cluster kubeconfigs (~/.kube/klimax).
	KubeDir string
	// KubeConfig is the shared kubeconfig merged into (~/.kube/config).
	KubeConfig string
	// KindKubeconfig, when set, is passed to kind as --kubeconfig so kind
	// never edits the user's own kubeconfig (host driver); klimax merges.
	KindKubeconfig string
	Progress       Progress
	// Warn receives non-fatal warnings.
	Warn io.Writer
	// Preflight, when set, must pass before kind creates anything (the
	// platform checks that `klimax up` made the network).
	Preflight func(ctx context.Context) error
	// ImageExists, when set, reports whether the machine's Docker engine
	// has an image: checked before `kind load docker-image`, and to find a
	// locally built klimax/node image (or name a missing one) before kind
	// would try to pull it.
	ImageExists func(ctx context.Context, ref string) (bool, error)
	// Leases records slot claims across klimax processes (nil: within
	// this call only).
	Leases *slot.Leases
	// PortFree, when set, checks that a slot's API port is free on the
	// machine before the slot is used.
	PortFree slot.PortCheck
	// LocalMachine is set when kind runs on this host (host driver), so a
	// directory kind writes is directly ours.
	LocalMachine bool
}

// LocalNodeRepository is the repository `klimax node-image build` tags
// (nodeimage.DefaultRepository).
const LocalNodeRepository = "klimax/node"

// NodeImage picks the node image for a Kubernetes version: kind.nodeImage's
// repository when set (klimax/node must then be in the engine), else
// klimax/node when the engine has it, else kindest/node.
func (m *Manager) NodeImage(ctx context.Context, version string) (string, error) {
	has := func(ref string) (bool, error) {
		if m.ImageExists == nil {
			return false, nil
		}
		return m.ImageExists(ctx, ref)
	}
	repo := m.Config.Kind.NodeImage
	if repo == "" {
		ref := LocalNodeRepository + ":" + version
		if ok, err := has(ref); err == nil && ok {
			return ref, nil
		}
		return "kindest/node:" + version, nil
	}
	ref := repo + ":" + version
	if repo == LocalNodeRepository && m.ImageExists != nil {
		ok, err := has(ref)
		if err != nil {
			return "", err
		}
		if !ok {
			return "", fmt.Errorf("no node image %s in the Docker engine: run `klimax node-image build` (it builds the Kubernetes version of the k3sm source tree), or set kind.nodeVersion to the version you built", ref)
		}
	}
	return ref, nil
}

func (m *Manager) progress() Progress {
	if m.Progress == nil {
		return noProgress{}
	}
	return m.Progress
}

func (m *Manager) warnf(format string, a ...any) {
	if m.Warn != nil {
		fmt.Fprintf(m.Warn, "warning: "+format+"\n", a...)
	}
}

func (m *Manager) step(title string, fn func() error) error {
	done := m.progress().Step(title)
	err := fn()
	done(err)
	return err
}

func (m *Manager) run(ctx context.Context, timeout time.Duration, stdin []byte, argv ...string) ([]byte, error) {
	opts := vm.RunOptions{Timeout: timeout}
	if stdin != nil {
		opts.Stdin = bytes.NewReader(stdin)
	}
	res, err := m.Runner.Run(ctx, argv, opts)
	return res.Stdout, err
}

func (m *Manager) kindArgs(args ...string) []string {
	argv := append([]string{"kind"}, args...)
	if m.KindKubeconfig != "" {
		argv = append(argv, "--kubeconfig", m.KindKubeconfig)
	}
	return argv
}

// KubeconfigPath is the per-cluster kubeconfig file.
func (m *Manager) KubeconfigPath(name string) string {
	return filepath.Join(m.KubeDir, name+".kubeconfig")
}

// MetricsServer is the optional metrics-server addon.
type MetricsServer struct {
	Enabled            bool
	Version            string
	KubeletInsecureTLS bool
}

// DefaultMetricsServerVersion is installed when a fleet enables the addon
// without a version.
const DefaultMetricsServerVersion = "v0.8.0"

// CreateOptions describe one cluster to create.
type CreateOptions struct {
	Name string
	Slot slot.Slot // 0 = lowest free
	// SlotHint makes Slot a preference (a fleet's plan) rather than a pin:
	// if it was taken meanwhile the lowest free slot is used.
	SlotHint    bool
	NodeVersion string // "" = config kind.nodeVersion
	Region      string
	Zone        string
	Fleet       string
	DependsOn   []string // fleet dependencies, recorded as node labels
	Labels      map[string]string
	// Mirrors selects registry mirrors by name; nil means all configured.
	Mirrors       []string
	MetricsServer MetricsServer
	// Workers is the number of worker nodes (0..MaxWorkers).
	Workers int
	// Wait, when > 0, waits up to this long at the end until every node
	// and kube-system pod is Ready.
	Wait time.Duration
}

// Validate checks what becomes node labels the way the kubelet will (see
// ValidateNodeLabel), before anything is created: a label the kubelet
// refuses only shows after kubeadm's 4-minute wait otherwise.
func (o CreateOptions) Validate() error {
	var errs []string
	keys := make([]string, 0, len(o.Labels))
	for k := range o.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if Reserved(k) {
			errs = append(errs, fmt.Sprintf("label %s is managed by klimax and cannot be set with -l or fleet labels (fix: remove it)", k))
		} else if err := ValidateNodeLabel("label", k, o.Labels[k]); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if o.Region != "" {
		if err := ValidateNodeLabel("region", LabelRegion, o.Region); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if o.Zone != "" {
		if err := ValidateNodeLabel("zone", LabelZone, o.Zone); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if err := ValidateWorkers("workers", o.Workers); err != nil {
		errs = append(errs, err.Error())
	}
	if o.Wait < 0 {
		errs = append(errs, fmt.Sprintf("wait: %s is negative (fix: use e.g. 5m, or 0 not to wait)", o.Wait))
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "\n"))
	}
	return nil
}

// Existing returns the existing kind clusters keyed by name.
func (m *Manager) Existing(ctx context.Context) (map[string]NodeContainer, error) {
	nodes, err := m.Inventory.ControlPlanes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]NodeContainer{}
	for _, n := range nodes {
		out[n.Cluster] = n
	}
	return out, nil
}

// UsedSlots lists slots held by existing clusters.
func UsedSlots(existing map[string]NodeContainer) []slot.Slot {
	var used []slot.Slot
	for _, n := range existing {
		if s, ok := n.Slot(); ok {
			used = append(used, s)
		}
	}
	return used
}

// Create makes a cluster and configures it. On failure after kind created
// the cluster, the cluster is left in place for inspection and the error says
// how to remove it.
func (m *Manager) Create(ctx context.Context, o CreateOptions) (*Info, error) {
	if err := ValidateName(o.Name); err != nil {
		return nil, err
	}
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("cluster %s: %w", o.Name, err)
	}
	mirrors, err := m.selectMirrors(o.Mirrors)
	if err != nil {
		return nil, err
	}
	if m.Preflight != nil {
		if err := m.Preflight(ctx); err != nil {
			return nil, fmt.Errorf("cluster %s: %w", o.Name, err)
		}
	}
	existing, err := m.Existing(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := existing[o.Name]; ok {
		return nil, fmt.Errorf("cluster %q already exists (delete it first, or pick another name)", o.Name)
	}
	// The slot is claimed under a lock shared by every klimax command and
	// recorded until kind has published its port, so concurrent creates
	// never pick the same one; slots whose API port something else holds
	// are skipped (or, pinned, refused).
	lease, skipped, err := m.Leases.Claim(ctx, slot.ClaimOptions{Cluster: o.Name, Slot: o.Slot, Hint: o.SlotHint, PortFree: m.PortFree,
		InUse: func(ctx context.Context) ([]slot.Slot, error) {
			now, err := m.Existing(ctx)
			if err != nil {
				return nil, err
			}
			if _, ok := now[o.Name]; ok {
				return nil, fmt.Errorf("cluster %q already exists (delete it first, or pick another name)", o.Name)
			}
			return UsedSlots(now), nil
		}})
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", o.Name, err)
	}
	defer lease.Release()
	s := lease.Slot
	if len(skipped) > 0 {
		m.warnf("cluster %s: skipped slot(s) because other programs hold their API port (%s); using slot %d (API :%d)", o.Name, strings.Join(skipped, ", "), s, s.APIPort())
	}
	if o.SlotHint && o.Slot != 0 && s != o.Slot {
		m.warnf("cluster %s: planned slot %d was taken meanwhile; using slot %d (API :%d)", o.Name, o.Slot, s, s.APIPort())
	}
	apiHost, err := m.APIHost(ctx)
	if err != nil {
		return nil, fmt.Errorf("find the API address: %w", err)
	}
	nodeVersion := o.NodeVersion
	if nodeVersion == "" {
		nodeVersion = m.Config.Kind.NodeVersion
	}
	image, err := m.NodeImage(ctx, nodeVersion)
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", o.Name, err)
	}
	spec := Spec{Name: o.Name, Slot: s, NodeVersion: nodeVersion, NodeImage: image, Region: o.Region, Zone: o.Zone,
		Fleet: o.Fleet, DependsOn: o.DependsOn, Labels: o.Labels, Workers: o.Workers, ListenAddress: m.ListenAddress, APIHost: apiHost}
	kc, err := KindConfig(spec)
	if err != nil {
		return nil, err
	}
	rendered, err := kc.Render()
	if err != nil {
		return nil, err
	}
	prefix := fmt.Sprintf("[%s] ", o.Name)
	if err := m.step(prefix+fmt.Sprintf("kind create cluster (slot %d, API :%d, %s)", s, s.APIPort(), image), func() error {
		_, err := m.run(ctx, KindCreateTimeout, rendered, m.kindArgs("create", "cluster", "--name", o.Name, "--config", "-")...)
		return err
	}); err != nil {
		return nil, fmt.Errorf("create cluster %s: %w", o.Name, err)
	}
	leftover := func(err error) error {
		return fmt.Errorf("%w\ncluster %s exists but is not fully configured; inspect it or remove it with: klimax cluster delete %s --yes", err, o.Name, o.Name)
	}
	if len(mirrors) > 0 {
		if err := m.step(prefix+fmt.Sprintf("configure %d registry mirrors", len(mirrors)), func() error {
			nodes, err := m.Inventory.Nodes(ctx, o.Name)
			if err != nil {
				return err
			}
			if len(nodes) != 1+o.Workers {
				return fmt.Errorf("kind made %d node containers, want %d", len(nodes), 1+o.Workers)
			}
			for _, n := range nodes {
				if err := m.writeHostsFiles(ctx, n.Container, mirrors); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return nil, leftover(err)
		}
	}
	var kubeconfigData []byte
	if err := m.step(prefix+"write kubeconfig "+m.KubeconfigPath(o.Name), func() error {
		kubeconfigData, err = m.fetchKubeconfig(ctx, o.Name, apiHost, s, true)
		return err
	}); err != nil {
		return nil, leftover(err)
	}
	kube, err := m.NewKube(kubeconfigData)
	if err != nil {
		return nil, leftover(err)
	}
	setupCtx, cancel := context.WithTimeout(ctx, SetupTimeout)
	defer cancel()
	if err := m.step(prefix+"install MetalLB "+m.Config.Kind.MetalLBVersion+" (pool "+s.MetalLBRanges(m.Config.Network.BridgePrefix())[1]+")", func() error {
		return m.installMetalLB(setupCtx, kube, s)
	}); err != nil {
		return nil, leftover(err)
	}
	if len(m.Config.Kind.CustomDNSResolvers) > 0 {
		if err := m.step(prefix+"configure CoreDNS forwarding", func() error {
			return ConfigureCoreDNS(setupCtx, kube, m.Config.Kind.CustomDNSResolvers)
		}); err != nil {
			return nil, leftover(err)
		}
	}
	if o.MetricsServer.Enabled {
		v := o.MetricsServer.Version
		if v == "" {
			v = DefaultMetricsServerVersion
		}
		if err := m.step(prefix+"install metrics-server "+v, func() error {
			objs, err := m.Manifests.MetricsServer(setupCtx, v)
			if err != nil {
				return err
			}
			if err := MetricsServerTweaks(objs, o.MetricsServer.KubeletInsecureTLS); err != nil {
				return err
			}
			return kube.Apply(setupCtx, objs)
		}); err != nil {
			return nil, leftover(err)
		}
	}
	if m.Config.Kind.AutoMergeKubeconfig && m.KubeConfig != "" {
		if err := m.step(prefix+"merge context "+ContextName(o.Name)+" into "+m.KubeConfig, func() error {
			_, err := kubeconfig.Merge(m.KubeConfig, kubeconfigData, kubeconfig.MergeOptions{})
			return err
		}); err != nil {
			return nil, leftover(err)
		}
	}
	if o.Wait > 0 {
		if err := m.step(prefix+fmt.Sprintf("wait up to %s for nodes and kube-system pods", o.Wait), func() error {
			wctx, cancel := context.WithTimeout(ctx, o.Wait)
			defer cancel()
			return kube.WaitReady(wctx)
		}); err != nil {
			return nil, fmt.Errorf("cluster %s was created but is not ready after %s: %w\n(inspect it with kubectl --context %s get pods -A, or collect logs with klimax cluster logs %s)",
				o.Name, o.Wait, err, ContextName(o.Name), o.Name)
		}
	}
	return &Info{Name: o.Name, Slot: int(s), APIPort: s.APIPort(), State: "running", Reachable: true,
		Server: fmt.Sprintf("https://%s:%d", apiHost, s.APIPort()), Labels: spec.NodeLabels(),
		Fleet: o.Fleet, DependsOn: o.DependsOn, Region: o.Region, Zone: o.Zone, Kubeconfig: m.KubeconfigPath(o.Name)}, nil
}

func (m *Manager) selectMirrors(names []string) ([]config.Mirror, error) {
	all := m.Config.Registries.Mirrors
	if names == nil {
		return all, nil
	}
	var out []config.Mirror
	for _, n := range names {
		if n == "*" {
			return all, nil
		}
		found := false
		for _, mi := range all {
			if mi.Name == n {
				out = append(out, mi)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("registry mirror %q is not configured (see registries.mirrors in the config)", n)
		}
	}
	return out, nil
}

// writeHostsFiles writes containerd hosts.toml files into the node without
// a shell: mkdir and `cp /dev/stdin` with the content on stdin.
func (m *Manager) writeHostsFiles(ctx context.Context, node string, mirrors []config.Mirror) error {
	for _, mi := range mirrors {
		h := HostsTOML(mi)
		if _, err := m.run(ctx, ShortTimeout, nil, "docker", "exec", node, "mkdir", "-p", filepath.Dir(h.Path)); err != nil {
			return err
		}
		if _, err := m.run(ctx, ShortTimeout, h.Content, "docker", "exec", "-i", node, "cp", "/dev/stdin", h.Path); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) fetchKubeconfig(ctx context.Context, name, apiHost string, s slot.Slot, save bool) ([]byte, error) {
	raw, err := m.run(ctx, ShortTimeout, nil, "kind", "get", "kubeconfig", "--name", name)
	if err != nil {
		return nil, err
	}
	kc, err := kubeconfig.RewriteServer(raw, fmt.Sprintf("https://%s:%d", apiHost, s.APIPort()))
	if err != nil {
		return nil, err
	}
	if !save {
		return kc, nil
	}
	if err := os.MkdirAll(m.KubeDir, 0o700); err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(m.KubeconfigPath(name), kc, 0o600); err != nil {
		return nil, err
	}
	return kc, nil
}

func (m *Manager) installMetalLB(ctx context.Context, kube Kube, s slot.Slot) error {
	objs, err := m.Manifests.MetalLB(ctx, m.Config.Kind.MetalLBVersion)
	if err != nil {
		return err
	}
	if err := kube.Apply(ctx, objs); err != nil {
		return err
	}
	// The pool is validated by MetalLB's webhook, served by the controller.
	if err := kube.WaitDeployment(ctx, MetalLBNamespace, "controller"); err != nil {
		return err
	}
	return kube.Apply(ctx, MetalLBObjects(s, m.Config.Network.BridgePrefix()))
}

// ConfigureCoreDNS edits the Corefile in place (see EditCorefile).
func ConfigureCoreDNS(ctx context.Context, kube Kube, resolvers []config.DNSResolver) error {
	cf, err := kube.Corefile(ctx)
	if err != nil {
		return err
	}
	edited, err := EditCorefile(cf, resolvers)
	if err != nil {
		return err
	}
	if edited == cf {
		return nil
	}
	return kube.SetCorefile(ctx, edited)
}

// Kubeconfig returns the cluster's kubeconfig, re-fetching it from kind when
// the file is missing (e.g. deleted by hand).
func (m *Manager) Kubeconfig(ctx context.Context, name string) ([]byte, error) {
	return m.kubeconfig(ctx, name, true)
}

// kubeconfig reads the per-cluster kubeconfig, or fetches it from kind,
// writing it to its file only when save is set: a read-only command
// (cluster list) must not create files.
func (m *Manager) kubeconfig(ctx context.Context, name string, save bool) ([]byte, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(m.KubeconfigPath(name))
	if err == nil {
		return data, nil
	}
	existing, lerr := m.Existing(ctx)
	if lerr != nil {
		return nil, lerr
	}
	n, ok := existing[name]
	if !ok {
		return nil, fmt.Errorf("cluster %q not found (see klimax cluster list)", name)
	}
	s, ok := n.Slot()
	if !ok {
		return nil, fmt.Errorf("cluster %q was not created by klimax (API port %d is not a klimax slot port)", name, n.APIPort)
	}
	apiHost, err := m.APIHost(ctx)
	if err != nil {
		return nil, err
	}
	return m.fetchKubeconfig(ctx, name, apiHost, s, save)
}

// ErrNotFound is returned for an unknown cluster.
var ErrNotFound = errors.New("cluster not found")

// Delete removes a cluster, its kubeconfig file and (autoRemoveKubeconfig)
// its merged context. Deleting a missing cluster still cleans its files.
func (m *Manager) Delete(ctx context.Context, name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	existing, err := m.Existing(ctx)
	if err != nil {
		return err
	}
	prefix := fmt.Sprintf("[%s] ", name)
	_, found := existing[name]
	if found {
		if err := m.step(prefix+"kind delete cluster", func() error {
			_, err := m.run(ctx, KindDeleteTimeout, nil, m.kindArgs("delete", "cluster", "--name", name)...)
			return err
		}); err != nil {
			return fmt.Errorf("delete cluster %s: %w", name, err)
		}
	}
	_, statErr := os.Stat(m.KubeconfigPath(name))
	if err := os.Remove(m.KubeconfigPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if m.Config.Kind.AutoRemoveKubeconfig && m.KubeConfig != "" {
		if err := m.step(prefix+"remove context "+ContextName(name)+" from "+m.KubeConfig, func() error {
			return kubeconfig.Remove(m.KubeConfig, []string{ContextName(name)})
		}); err != nil {
			return err
		}
	}
	if !found {
		if statErr == nil {
			m.warnf("cluster %s did not exist; removed its leftover kubeconfig", name)
			return nil
		}
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return nil
}

// Info is one cluster as listed.
type Info struct {
	Name       string            `json:"name" yaml:"name"`
	Slot       int               `json:"slot" yaml:"slot"`
	APIPort    int               `json:"apiPort" yaml:"apiPort"`
	State      string            `json:"state" yaml:"state"`
	Reachable  bool              `json:"reachable" yaml:"reachable"`
	Server     string            `json:"server,omitempty" yaml:"server,omitempty"`
	Fleet      string            `json:"fleet,omitempty" yaml:"fleet,omitempty"`
	Region     string            `json:"region,omitempty" yaml:"region,omitempty"`
	Zone       string            `json:"zone,omitempty" yaml:"zone,omitempty"`
	DependsOn  []string          `json:"dependsOn,omitempty" yaml:"dependsOn,omitempty"`
	Labels     map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
	Kubeconfig string            `json:"kubeconfig,omitempty" yaml:"kubeconfig,omitempty"`
	Error      string            `json:"error,omitempty" yaml:"error,omitempty"`
}

// List returns every kind cluster with its node labels, filtered by a label
// selector (""=all). Unreachable clusters are listed with Reachable=false and
// do not match a non-empty selector.
func (m *Manager) List(ctx context.Context, selector string) ([]Info, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, fmt.Errorf("label selector %q: %w", selector, err)
	}
	nodes, err := m.Inventory.ControlPlanes(ctx)
	if err != nil {
		return nil, err
	}
	infos := make([]Info, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func(i int, n NodeContainer) {
			defer wg.Done()
			infos[i] = m.describe(ctx, n)
		}(i, n)
	}
	wg.Wait()
	var out []Info
	for _, in := range infos {
		if selector == "" || (in.Reachable && sel.Matches(labels.Set(in.Labels))) {
			out = append(out, in)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (m *Manager) describe(ctx context.Context, n NodeContainer) Info {
	in := Info{Name: n.Cluster, APIPort: n.APIPort, State: n.State}
	if s, ok := n.Slot(); ok {
		in.Slot = int(s)
	}
	if _, err := os.Stat(m.KubeconfigPath(n.Cluster)); err == nil {
		in.Kubeconfig = m.KubeconfigPath(n.Cluster)
	}
	if n.State != "running" {
		in.Error = "node container is " + n.State
		return in
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kc, err := m.kubeconfig(ctx, n.Cluster, false)
	if err != nil {
		in.Error = err.Error()
		return in
	}
	in.Server, _ = kubeconfig.Server(kc, "")
	kube, err := m.NewKube(kc)
	if err != nil {
		in.Error = err.Error()
		return in
	}
	l, err := kube.NodeLabels(ctx)
	if err != nil {
		in.Error = err.Error()
		return in
	}
	in.Reachable = true
	in.Labels = l
	in.Fleet, in.Region, in.Zone = l[LabelFleet], l[LabelRegion], l[LabelZone]
	in.DependsOn = DepsFromLabels(l)
	if v, err := strconv.Atoi(l[LabelSlot]); err == nil && in.Slot == 0 {
		in.Slot = v
	}
	return in
}

// Label sets and removes node labels. Keys klimax manages are refused unless
// allowReserved (used by fleet adoption).
func (m *Manager) Label(ctx context.Context, name string, set map[string]string, remove []string, allowReserved bool) error {
	if len(set) == 0 && len(remove) == 0 {
		return fmt.Errorf("no labels given (use -l key=value to set, -l key- to remove)")
	}
	if !allowReserved {
		for k := range set {
			if Reserved(k) {
				return fmt.Errorf("label %s is managed by klimax (use klimax fleet adopt for fleet membership)", k)
			}
		}
		for _, k := range remove {
			if Reserved(k) {
				return fmt.Errorf("label %s is managed by klimax and cannot be removed", k)
			}
		}
	}
	kc, err := m.Kubeconfig(ctx, name)
	if err != nil {
		return err
	}
	kube, err := m.NewKube(kc)
	if err != nil {
		return err
	}
	return kube.LabelNode(ctx, set, remove)
}
