// Package cli owns the klimax command line: the cobra command tree, flag
// parsing, output formats (-o text|json|yaml), confirmations and pickers, and
// the wiring of config, the platform facade (VM, Docker, network) and the
// cluster/fleet managers. cmd/klimax only calls Execute.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker"
	"github.com/k3sm-dev/k3sm/internal/klimax/platform"
	"github.com/k3sm-dev/k3sm/internal/klimax/ui"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// Platform is what the CLI needs from the platform facade; *platform.Platform
// implements it and tests substitute a fake.
type Platform interface {
	Up(ctx context.Context, progress platform.Progress) error
	Down(ctx context.Context, removeRoute bool) error
	Destroy(ctx context.Context) error
	Status(ctx context.Context) (*platform.Status, error)
	Doctor(ctx context.Context) []platform.Check
	Shell(ctx context.Context, args []string) error
	DockerEnv(unset bool) string
	DockerContext(ctx context.Context, unset bool) (string, error)
	CleanCache(ctx context.Context) error
	Guest() vm.Runner
	APIHost(ctx context.Context) (string, error)
	DockerHost() string
	Driver() vm.Driver
}

// Streams are the process's terminal.
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
	// InTTY/OutTTY say whether In/Out are interactive terminals.
	InTTY, OutTTY bool
}

// App holds global flags and lazily built dependencies.
type App struct {
	Streams
	ConfigPath   string
	Debug        bool
	LimaLogLevel string
	ShowVMLogs   bool

	// Hooks for tests; nil means build the real thing.
	NewPlatform func(cfg *config.Config) (Platform, error)
	NewClusters func(cfg *config.Config, p Platform) (*cluster.Manager, error)
	// Home overrides the user's home directory (tests).
	Home string

	cfg      *config.Config
	plat     Platform
	clusters *cluster.Manager
}

func (a *App) home() string {
	if a.Home != "" {
		return a.Home
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return "."
	}
	return h
}

func (a *App) klimaxHome() string {
	if a.Home != "" {
		return filepath.Join(a.Home, ".klimax")
	}
	return config.Home()
}

func (a *App) configPath() string {
	if a.ConfigPath != "" {
		return a.ConfigPath
	}
	return filepath.Join(a.klimaxHome(), "config.yaml")
}

// Config loads (once) and validates the config file.
func (a *App) Config() (*config.Config, error) {
	if a.cfg != nil {
		return a.cfg, nil
	}
	c, err := config.Load(a.configPath())
	if err != nil {
		return nil, fmt.Errorf("%w\n(edit it with: klimax config edit)", err)
	}
	a.cfg = c
	return c, nil
}

// Platform builds (once) the platform facade.
func (a *App) Platform() (Platform, error) {
	if a.plat != nil {
		return a.plat, nil
	}
	cfg, err := a.Config()
	if err != nil {
		return nil, err
	}
	if a.NewPlatform != nil {
		a.plat, err = a.NewPlatform(cfg)
		return a.plat, err
	}
	opts := platform.Options{Home: a.klimaxHome(), LimaLogLevel: a.LimaLogLevel, Stdin: a.In, Stdout: a.Out, Stderr: a.Err}
	if a.ShowVMLogs {
		opts.VMLogs = a.Err
	}
	p, err := platform.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	a.plat = p
	return p, nil
}

// KubeDir is ~/.kube/klimax.
func (a *App) KubeDir() string { return filepath.Join(a.home(), ".kube", "klimax") }

// SharedKubeconfig is the kubeconfig klimax merges into: the first entry of
// $KUBECONFIG when set, else ~/.kube/config.
func (a *App) SharedKubeconfig() string {
	if a.Home == "" {
		if kc := os.Getenv("KUBECONFIG"); kc != "" {
			if first := strings.Split(kc, string(os.PathListSeparator))[0]; first != "" {
				return first
			}
		}
	}
	return filepath.Join(a.home(), ".kube", "config")
}

// Clusters builds (once) the cluster manager on top of the platform.
func (a *App) Clusters() (*cluster.Manager, error) {
	if a.clusters != nil {
		return a.clusters, nil
	}
	cfg, err := a.Config()
	if err != nil {
		return nil, err
	}
	p, err := a.Platform()
	if err != nil {
		return nil, err
	}
	if a.NewClusters != nil {
		a.clusters, err = a.NewClusters(cfg, p)
		return a.clusters, err
	}
	runner := p.Guest()
	if a.Debug {
		runner = &debugRunner{Runner: runner, w: a.Err}
	}
	m := &cluster.Manager{
		Config:    cfg,
		Runner:    runner,
		Inventory: cluster.DockerInventory{Host: p.DockerHost()},
		APIHost:   p.APIHost,
		NewKube: func(kc []byte) (cluster.Kube, error) {
			return cluster.NewClientKube(kc)
		},
		Manifests:  &cluster.Manifests{Dir: filepath.Join(a.klimaxHome(), "cache", "manifests")},
		KubeDir:    a.KubeDir(),
		KubeConfig: a.SharedKubeconfig(),
		Progress:   a.Progress(),
		Warn:       a.Err,
	}
	if nr, ok := p.(interface{ NetworkReady(context.Context) error }); ok {
		m.Preflight = nr.NetworkReady
	}
	host := p.DockerHost()
	m.ImageExists = func(ctx context.Context, ref string) (bool, error) {
		dc, err := docker.New(host)
		if err != nil {
			return false, err
		}
		defer dc.Close()
		return dc.ImageExists(ctx, ref)
	}
	if p.Driver().NeedsRoute() {
		m.ListenAddress = "0.0.0.0" // reachable from the host through the VM's address
	} else {
		m.ListenAddress = "127.0.0.1"
		// Keep kind from editing the user's kubeconfig on a Linux host; klimax merges atomically.
		m.KindKubeconfig = filepath.Join(a.klimaxHome(), "kind.kubeconfig")
	}
	a.clusters = m
	return m, nil
}

// Progress returns the progress reporter for this terminal.
func (a *App) Progress() *ui.Progress { return ui.NewProgress(a.Err, a.OutTTY) }

// ExitError carries a process exit code without printing anything more.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// ExitCode maps an error to a process exit code.
func ExitCode(err error) int {
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	if err != nil {
		return 1
	}
	return 0
}
