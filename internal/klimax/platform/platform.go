// Package platform is the facade the klimax CLI calls for everything below
// the clusters: the machine (Lima VM or local host), its Docker engine, the
// shared kind network, the registry mirrors, the host route and the guest
// no-SNAT rules, plus docker-env/docker-context and doctor checks. Every
// operation is idempotent: Up on a platform that is already up changes
// nothing.
package platform

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker"
	"github.com/k3sm-dev/k3sm/internal/klimax/guest"
	"github.com/k3sm-dev/k3sm/internal/klimax/hostnet"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// KindNetwork is the Docker network name kind uses for its nodes.
const KindNetwork = "kind"

// Options tune New; the zero value is right for the CLI.
type Options struct {
	// Home is klimax's state directory (default config.Home()).
	Home string
	// Driver replaces the driver chosen by cfg.VM.Driver (tests).
	Driver vm.Driver
	// NetworkName is the shared Docker network (default "kind", which kind
	// requires; tests use their own so they never touch a user's network).
	NetworkName string
	// MirrorImage is the registry image run in proxy mode
	// (default docker.DefaultMirrorImage).
	MirrorImage string
	// CacheDir is the registry cache root on the engine's machine (default:
	// <Home>/registry-cache with cacheStorage host or the host driver,
	// guest.DefaultSpec().CacheDir in the VM with cacheStorage guest).
	CacheDir string
	// Router manages the host route (default hostnet.NewRouter()).
	Router *hostnet.Router
	// DockerConfigDir is the docker CLI config dir for docker-context
	// (default $DOCKER_CONFIG or ~/.docker).
	DockerConfigDir string
	// LimaLogLevel is passed to limactl --log-level (--lima-log-level).
	LimaLogLevel string
	// VMLogs receives limactl output during create/start (--show-vm-logs).
	VMLogs io.Writer
	// Limactl overrides the limactl binary.
	Limactl string
	// Stdin/Stdout/Stderr are the terminal for Shell (default os.Std*).
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Guest overrides the provisioning inputs (default guest.DefaultSpec()).
	Guest *guest.Spec
}

// Platform is the machine plus what klimax keeps in its Docker engine.
type Platform struct {
	cfg    *config.Config
	opts   Options
	driver vm.Driver
	bridge netip.Prefix
	router *hostnet.Router
}

// Progress reports a long step: it is called when the step starts and the
// returned func when it ends (err nil on success). nil means silent.
type Progress func(step string) (done func(err error))

func (p Progress) step(name string) func(error) {
	if p == nil {
		return func(error) {}
	}
	return p(name)
}

// New validates cfg and prepares the driver; it changes nothing.
func New(cfg *config.Config, opts Options) (*Platform, error) {
	if cfg == nil {
		return nil, errors.New("platform: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bridge, err := guest.ValidateCIDR("network.kindBridgeCIDR", cfg.Network.KindBridgeCIDR)
	if err != nil {
		return nil, err
	}
	if opts.Home == "" {
		opts.Home = config.Home()
	}
	if opts.NetworkName == "" {
		opts.NetworkName = KindNetwork
	}
	if opts.MirrorImage == "" {
		opts.MirrorImage = cfg.Registries.MirrorImage
	}
	if opts.MirrorImage == "" {
		opts.MirrorImage = docker.DefaultMirrorImage
	}
	if opts.DockerConfigDir == "" {
		opts.DockerConfigDir = docker.CLIConfigDir()
	}
	if opts.Stdin == nil {
		opts.Stdin = os.Stdin
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	gspec := guest.DefaultSpec()
	if opts.Guest != nil {
		gspec = *opts.Guest
	}
	p := &Platform{cfg: cfg, opts: opts, bridge: bridge, router: opts.Router}
	if p.router == nil {
		p.router = hostnet.NewRouter()
	}
	hostCache := filepath.Join(opts.Home, "registry-cache")
	switch {
	case opts.Driver != nil:
		p.driver = opts.Driver
		if p.opts.CacheDir == "" {
			p.opts.CacheDir = hostCache
		}
	case cfg.VM.Driver == config.DriverHost:
		p.driver = vm.NewHost()
		if p.opts.CacheDir == "" {
			p.opts.CacheDir = hostCache
		}
	case cfg.VM.Driver == config.DriverLima:
		spec := vm.LimaSpec{
			Name: cfg.VM.Name, CPUs: cfg.VM.CPUs, Memory: cfg.VM.Memory, Disk: cfg.VM.Disk,
			Rosetta: cfg.VM.Rosetta, DisablePortMirroring: cfg.Network.DisablePortMirroring,
			DockerSocket: cfg.DockerSocketPath(),
		}
		if cfg.Registries.CacheStorage == config.CacheHost {
			spec.CacheDir = hostCache
			if p.opts.CacheDir == "" {
				p.opts.CacheDir = hostCache // mounted at the same path in the guest
			}
		} else if p.opts.CacheDir == "" {
			p.opts.CacheDir = gspec.CacheDir
		}
		gspec.CacheDir = p.opts.CacheDir
		script, err := guest.Render(gspec)
		if err != nil {
			return nil, err
		}
		spec.ProvisionScript = string(script)
		l := vm.NewLima(spec, filepath.Join(opts.Home, "lima"))
		l.LogLevel, l.Logs = opts.LimaLogLevel, opts.VMLogs
		if opts.Limactl != "" {
			l.Limactl = opts.Limactl
		}
		p.driver = l
	default:
		return nil, fmt.Errorf("vm.driver: unknown driver %q (fix: use lima or host)", cfg.VM.Driver)
	}
	return p, nil
}

// Driver exposes the machine driver.
func (p *Platform) Driver() vm.Driver { return p.driver }

// NetworkName is the shared Docker network.
func (p *Platform) NetworkName() string { return p.opts.NetworkName }

// Mirrors are the configured pull-through mirrors (for containerd hosts.toml:
// each is reachable from kind nodes at Mirror.Endpoint()).
func (p *Platform) Mirrors() []config.Mirror { return p.cfg.Registries.Mirrors }

// DockerHost is the DOCKER_HOST that reaches the engine ("" = default).
func (p *Platform) DockerHost() string { return p.driver.DockerHost() }

// Docker connects to the machine's engine.
func (p *Platform) Docker() (*docker.Client, error) { return docker.New(p.driver.DockerHost()) }

func (p *Platform) networkSpec() docker.NetworkSpec {
	return docker.NetworkSpec{Name: p.opts.NetworkName, Subnet: p.bridge}
}

func (p *Platform) mirrorSpec(m config.Mirror) docker.MirrorSpec {
	return docker.MirrorSpec{
		Name: m.Name, Port: m.Port, RemoteURL: m.RemoteURL, Username: m.Username, Password: m.Password,
		Image: p.opts.MirrorImage, Network: p.opts.NetworkName,
		CacheDir:  filepath.Join(p.opts.CacheDir, m.Name),
		PublishIP: netip.MustParseAddr("127.0.0.1"),
	}
}

func (p *Platform) ruleSpec() hostnet.RuleSpec {
	return hostnet.RuleSpec{BridgeCIDR: p.bridge, VMIface: "lima0"}
}

// Up brings everything up: machine, engine, network, mirrors and, for a VM,
// the guest no-SNAT rules and the host route. Steps already in place are
// left alone, so a second Up changes nothing.
// hostEngineWait is how long `up` waits for the local engine with the host
// driver before saying how to start it.
var hostEngineWait = 5 * time.Second

func (p *Platform) Up(ctx context.Context, progress Progress) (err error) {
	run := func(name string, f func() error) error {
		done := progress.step(name)
		err := f()
		done(err)
		return err
	}
	if p.cfg.Registries.CacheStorage == config.CacheHost || p.driver.Name() == config.DriverHost {
		if err := os.MkdirAll(p.opts.CacheDir, 0o755); err != nil {
			return fmt.Errorf("registry cache dir: %w", err)
		}
	}
	if err := run("Starting "+p.driver.Name()+" machine "+p.cfg.VM.Name, func() error {
		_, err := p.driver.Ensure(ctx)
		return err
	}); err != nil {
		return err
	}
	dc, err := p.Docker()
	if err != nil {
		return err
	}
	defer dc.Close()
	// A VM just started needs time for its engine; on the host nobody is
	// starting one, so a short wait tells "not running" from "busy".
	engineWait := 2 * time.Minute
	if p.driver.Name() == config.DriverHost {
		engineWait = hostEngineWait
	}
	if err := run("Waiting for the Docker engine", func() error {
		_, err := dc.WaitReady(ctx, engineWait)
		if err != nil {
			return fmt.Errorf("no Docker engine answers (%w); %s", err, fixFor(p.driver.Name()))
		}
		return nil
	}); err != nil {
		return err
	}
	if err := run(fmt.Sprintf("Docker network %s (%s)", p.opts.NetworkName, p.bridge), func() error {
		if err := p.checkRouteClash(ctx); err != nil {
			return err
		}
		_, err := dc.EnsureNetwork(ctx, p.networkSpec())
		return err
	}); err != nil {
		return err
	}
	// Mirrors removed from the config go first (one may hold a port a
	// configured mirror now uses); their caches are kept.
	managed, err := dc.ManagedMirrors(ctx, p.opts.NetworkName)
	if err != nil {
		return err
	}
	configured := p.cfg.MirrorNames()
	var stale []string
	for _, n := range managed {
		if !slices.Contains(configured, n) {
			stale = append(stale, n)
		}
	}
	if len(stale) > 0 {
		if err := run(fmt.Sprintf("Remove registry mirror(s) %s (no longer in registries.mirrors; caches kept)", strings.Join(stale, ", ")), func() error {
			_, err := dc.PruneMirrors(ctx, p.opts.NetworkName, configured)
			return err
		}); err != nil {
			return err
		}
	}
	for _, m := range p.cfg.Registries.Mirrors {
		spec := p.mirrorSpec(m)
		if err := run(fmt.Sprintf("Registry mirror %s -> %s", m.Name, m.RemoteURL), func() error {
			_, err := dc.EnsureMirror(ctx, spec)
			return err
		}); err != nil {
			return err
		}
	}
	if !p.driver.NeedsRoute() {
		return nil
	}
	if err := run("No-SNAT rules in the VM", func() error {
		_, err := hostnet.EnsureRules(ctx, p.driver, p.ruleSpec())
		return err
	}); err != nil {
		return err
	}
	return run("Host route "+p.bridge.String(), func() error {
		gw, err := p.driver.HostAddress(ctx)
		if err != nil {
			return err
		}
		_, err = p.router.Ensure(ctx, p.bridge, gw)
		return err
	})
}

// checkRouteClash refuses a bridge CIDR that the machine already routes
// somewhere other than a Docker bridge (e.g. a VPN or LAN route).
func (p *Platform) checkRouteClash(ctx context.Context) error {
	res, err := p.driver.Run(ctx, []string{"ip", "-j", "-4", "route", "show"}, vm.RunOptions{Timeout: 30 * time.Second})
	if err != nil {
		return nil // no iproute2 JSON: Docker's own overlap check still applies
	}
	clash, err := hostnet.RouteClash(res.Stdout, p.bridge)
	if err != nil || clash == "" {
		return nil
	}
	return &docker.ClashError{
		Msg: fmt.Sprintf("network.kindBridgeCIDR %s overlaps the existing route %s", p.bridge, clash),
		Fix: "choose another network.kindBridgeCIDR in ~/.klimax/config.yaml",
	}
}

// Down stops the machine (a VM) or, with the host driver, klimax's mirror
// containers; clusters, network and caches are kept. removeRoute also
// deletes the host route.
func (p *Platform) Down(ctx context.Context, removeRoute bool) error {
	if p.driver.NeedsRoute() {
		if removeRoute {
			if _, err := p.router.Remove(ctx, p.bridge); err != nil {
				return err
			}
		}
		return p.driver.Stop(ctx)
	}
	dc, err := p.Docker()
	if err != nil {
		return err
	}
	defer dc.Close()
	if _, err := dc.Ping(ctx); err != nil {
		return err
	}
	names, err := dc.ManagedMirrors(ctx, p.opts.NetworkName)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := dc.StopMirror(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// Destroy removes everything klimax made: the VM (with everything in it) or,
// on the host, the mirror containers and the network it created; the host
// route; the Docker CLI context. The registry cache on the host is kept
// (`registry clean-cache` removes it).
func (p *Platform) Destroy(ctx context.Context) error {
	var errs []error
	if p.driver.NeedsRoute() {
		if _, err := p.router.Remove(ctx, p.bridge); err != nil {
			errs = append(errs, err)
		}
		if err := p.driver.Delete(ctx); err != nil {
			errs = append(errs, err)
		}
	} else if err := p.destroyHost(ctx); err != nil {
		errs = append(errs, err)
	}
	if _, err := p.contextStore().Unset(p.contextName()); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (p *Platform) destroyHost(ctx context.Context) error {
	dc, err := p.Docker()
	if err != nil {
		return err
	}
	defer dc.Close()
	if _, err := dc.Ping(ctx); err != nil {
		return err
	}
	names, err := dc.ManagedMirrors(ctx, p.opts.NetworkName)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := dc.RemoveMirror(ctx, n); err != nil {
			return err
		}
	}
	_, err = dc.RemoveNetwork(ctx, p.opts.NetworkName)
	return err
}

// CleanCache empties the registry caches: mirrors are stopped, their cache
// directories removed, and the mirrors started again if they ran.
func (p *Platform) CleanCache(ctx context.Context) error {
	dc, err := p.Docker()
	if err != nil {
		return err
	}
	defer dc.Close()
	if _, err := dc.Ping(ctx); err != nil {
		return err
	}
	for _, m := range p.cfg.Registries.Mirrors {
		spec := p.mirrorSpec(m)
		st, err := dc.MirrorState(ctx, spec)
		if err != nil {
			return err
		}
		if st.Running {
			if err := dc.StopMirror(ctx, m.Name); err != nil {
				return err
			}
		}
		if err := p.removeCacheDir(ctx, spec.CacheDir); err != nil {
			return err
		}
		if st.Running {
			if _, err := dc.EnsureMirror(ctx, spec); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *Platform) removeCacheDir(ctx context.Context, dir string) error {
	if err := guest.ValidatePath("registry cache dir", dir); err != nil {
		return err
	}
	if p.driver.Name() == config.DriverLima && p.cfg.Registries.CacheStorage == config.CacheGuest {
		_, err := p.driver.Run(ctx, []string{"rm", "-rf", "--", dir}, vm.RunOptions{Root: true, Timeout: 5 * time.Minute})
		return err
	}
	// The registry runs as root: its files may not be ours to delete.
	if err := os.RemoveAll(dir); err != nil {
		_, rerr := p.driver.Run(ctx, []string{"rm", "-rf", "--", dir}, vm.RunOptions{Root: true, Timeout: 5 * time.Minute})
		return rerr
	}
	return nil
}

// Shell opens an interactive shell in the machine, or runs args there.
func (p *Platform) Shell(ctx context.Context, args []string) error {
	return p.driver.Shell(ctx, args, vm.IO{Stdin: p.opts.Stdin, Stdout: p.opts.Stdout, Stderr: p.opts.Stderr})
}

// Guest runs kind/kubectl (or any) commands in the machine, with timeouts
// and cancellation (vm.RunOptions).
func (p *Platform) Guest() vm.Runner { return p.driver }

// APIHost is the address kubeconfigs use for API servers: the VM's lima0
// address (read now), or 127.0.0.1 on the host.
func (p *Platform) APIHost(ctx context.Context) (string, error) {
	a, err := p.driver.HostAddress(ctx)
	if err != nil {
		return "", err
	}
	return a.String(), nil
}

// DockerEnv returns the shell lines of `docker-env` (or `docker-env --unset`).
func (p *Platform) DockerEnv(unset bool) string {
	host := p.driver.DockerHost()
	if host == "" {
		host = defaultDockerHost()
	}
	return docker.EnvLines(host, unset)
}

func defaultDockerHost() string {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return h
	}
	return "unix:///var/run/docker.sock"
}

func (p *Platform) contextName() string { return p.cfg.VM.Name }

func (p *Platform) contextStore() docker.ContextStore {
	return docker.ContextStore{Dir: p.opts.DockerConfigDir}
}

// DockerContext creates (and switches to) the Docker CLI context named after
// the VM, or with unset switches back to the default and removes it. It
// returns a one-line description of what it did.
func (p *Platform) DockerContext(ctx context.Context, unset bool) (string, error) {
	name := p.contextName()
	if unset {
		removed, err := p.contextStore().Unset(name)
		if err != nil {
			return "", err
		}
		if !removed {
			return fmt.Sprintf("docker context %q does not exist", name), nil
		}
		return fmt.Sprintf("removed docker context %q (current context is the default again)", name), nil
	}
	host := p.driver.DockerHost()
	if host == "" {
		host = defaultDockerHost()
	}
	if err := p.contextStore().Set(name, host, "klimax "+p.driver.Name()+" Docker engine"); err != nil {
		return "", err
	}
	return fmt.Sprintf("docker context %q -> %s is now current", name, host), nil
}
