// Package daemon is the k3sm runtime daemon, the containerd analog: it
// serves the api/runtime/v1 contract (Runtime and Images services) on a 0600
// unix socket inside a 0700 directory and runs pods through the lifecycle in
// package pod, one resident k3sm-shim per container.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/runtime/clone"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
	"github.com/k3sm-dev/k3sm/internal/runtime/pod"
	"github.com/k3sm-dev/k3sm/internal/runtime/pressure"
	"github.com/k3sm-dev/k3sm/internal/runtime/registry"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	"github.com/k3sm-dev/k3sm/internal/runtime/shimclient"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
)

// Config configures the daemon. Only DataDir is required.
type Config struct {
	// DataDir holds pods/<uid>/ (pod roots and state), images/ (the image
	// store), logs/pods/ (CRI logs) and run/ (lock, shim sockets).
	DataDir string
	// Socket is the gRPC socket; default <DataDir>/run/runtime.sock. Its
	// directory is created 0700, or must already be private (no group or
	// other access). Keep it short: unix socket paths are limited to ~104
	// bytes.
	Socket string
	// DisableSandbox runs containers without the sandbox (benchmarks
	// measuring its cost; see pod.Config).
	DisableSandbox bool
	// JoinCgroupsAfterStart moves each container's first process into its
	// cgroup after it was created, where cgroup v2 would let the kernel
	// create it there (CLONE_INTO_CGROUP): the benchmark's comparison,
	// never for real use.
	JoinCgroupsAfterStart bool
	// ShimPath is the k3sm-shim binary; default: k3sm-shim next to the
	// running executable, else on $PATH.
	ShimPath string
	// RegistriesFile is a k3s-style registries.yaml (mirrors, plain-HTTP
	// endpoints, auth, TLS); read once at start. Missing file = no config.
	RegistriesFile string
	// RegistryPort serves the node-local registry (package registry) on
	// 127.0.0.1; 0: none.
	RegistryPort int
	// MaxPods is reported as the pod capacity; default 110.
	MaxPods int64
	// Back-off tuning; zero takes the kubelet's values (10 s doubling to
	// 300 s, reset after 10 min running). Tests shorten them.
	CrashLoopBackOffBase time.Duration
	CrashLoopBackOffMax  time.Duration
	BackOffResetAfter    time.Duration
	ImagePullBackOffBase time.Duration
	ImagePullBackOffMax  time.Duration
	// EmptyDirCheckInterval: how often emptyDir sizeLimits are checked (10 s).
	EmptyDirCheckInterval time.Duration
	// MemoryThreshold is --eviction-hard's memory.available: below it one
	// pod is evicted every HousekeepingInterval (10 s). Nil: none.
	MemoryThreshold      *pressure.Threshold
	HousekeepingInterval time.Duration
	// ContainerLogMaxSize and ContainerLogMaxFiles rotate container logs as
	// the kubelet's containerLogMaxSize / containerLogMaxFiles do: each
	// container's shim renames its live log to <n>.log.<timestamp> once it
	// reaches the size and keeps at most that many files (the live one
	// included). Zero takes the kubelet's 10 MiB and 5; a negative size
	// never rotates.
	ContainerLogMaxSize  int64
	ContainerLogMaxFiles int
	// NetdSocket is k3sm-netd's socket: pods get a network namespace and
	// an address of their own. Empty: pods share the node's network (the
	// reason is NoPodNetworkReason).
	NetdSocket         string
	NoPodNetworkReason string
	// ServiceCIDR and ClusterCIDR go to netd with the node's pod range:
	// Service addresses local to the node, the rest of the cluster range
	// refused here.
	ServiceCIDR, ClusterCIDR string
	// Cgroups configures the pods' cgroups (package cgroups): the subtree
	// name below the daemon's cgroup (default "k3sm"), the per-pod pids
	// limit (default 4096) and Disable, which leaves limits to the
	// sampler.
	Cgroups cgroups.Options
	// KeepCgroupAttachMode leaves the host's cgroup2 favordynmods as it is;
	// otherwise a daemon run as root sets it (cgroups.FavorDynamicChanges).
	KeepCgroupAttachMode bool
	// Version is reported by GetRuntimeInfo.
	Version string
	Logger  *slog.Logger
	// OnReady, if set, is called once the socket accepts calls.
	OnReady func()
}

// The kubelet's containerLogMaxSize and containerLogMaxFiles.
const (
	DefaultContainerLogMaxSize  = 10 << 20
	DefaultContainerLogMaxFiles = 5
)

// Run serves until ctx ends. Stopping the daemon never stops pods: their
// shims keep running and the next daemon on the same DataDir re-attaches.
func Run(ctx context.Context, cfg Config) error {
	if cfg.DataDir == "" {
		return errors.New("runtime daemon: Config.DataDir is required (e.g. /var/lib/k3sm/runtime)")
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return err
	}
	cfg.DataDir = dataDir
	if cfg.Socket == "" {
		cfg.Socket = datadir.New(dataDir).RuntimeSocket()
	}
	if cfg.Socket, err = filepath.Abs(cfg.Socket); err != nil {
		return err
	}
	if len(cfg.Socket) > 100 {
		return fmt.Errorf("runtime daemon: Config.Socket %s is %d bytes; unix socket paths must stay under ~104: choose a shorter path", cfg.Socket, len(cfg.Socket))
	}
	if cfg.MaxPods <= 0 {
		cfg.MaxPods = 110
	}
	switch {
	case cfg.ContainerLogMaxSize == 0:
		cfg.ContainerLogMaxSize = DefaultContainerLogMaxSize
	case cfg.ContainerLogMaxSize < 0:
		cfg.ContainerLogMaxSize = 0
	}
	if cfg.ContainerLogMaxFiles <= 0 {
		cfg.ContainerLogMaxFiles = DefaultContainerLogMaxFiles
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger
	if cfg.ShimPath, err = findShim(cfg.ShimPath); err != nil {
		return err
	}

	dirs := datadir.New(dataDir)
	shimDir := dirs.ShimDir()
	for _, d := range []string{dataDir, dirs.RunDir(), shimDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("runtime daemon: Config.DataDir: %w", err)
		}
	}
	// One daemon per data dir: a second one would fight over the pods.
	lock, err := os.OpenFile(dirs.RuntimeLock(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	// A predecessor just killed may still be exiting (its lock goes with
	// its last file): wait for it a while before calling it a second daemon.
	for deadline := time.Now().Add(lockWait); ; time.Sleep(50 * time.Millisecond) {
		err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) || ctx.Err() != nil {
			b, _ := os.ReadFile(lock.Name())
			return fmt.Errorf("runtime daemon: another daemon (pid %s) already serves data dir %s (stop it first)", string(b), dataDir)
		}
	}
	lock.Truncate(0)
	lock.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)

	ln, err := listen(cfg.Socket)
	if err != nil {
		return err
	}
	defer os.Remove(cfg.Socket)

	regs, err := image.LoadRegistries(cfg.RegistriesFile)
	if err != nil {
		ln.Close()
		return err
	}
	store, err := image.NewStore(dirs.ImagesDir(), regs)
	if err != nil {
		ln.Close()
		return err
	}
	starter := &shimclient.Starter{ShimPath: cfg.ShimPath, SocketDir: shimDir, JoinCgroupsAfterStart: cfg.JoinCgroupsAfterStart}
	var network pod.Network
	var netd *netdNetwork
	if cfg.NetdSocket != "" {
		split := ""
		if os.Geteuid() != 0 {
			// Not root: the pods' namespaces are the daemon's own, and
			// netd pins them (NewPodNamespaces).
			split = cfg.ShimPath
		}
		netd = newNetdNetwork(cfg.NetdSocket, cfg.ServiceCIDR, cfg.ClusterCIDR, split)
		network = netd
	}
	cg := cgroups.New(cfg.Cgroups)
	if sup := cg.Support(); cg.Version() == cgroups.None {
		// GetRuntimeInfo reports it too, for doctor and status; pods with
		// a limit get a LimitNotEnforced event.
		log.Warn("resources: no cgroups; limits enforced by the sampler (memory checked every second, CPU only as a nice priority, no pids limit)", "reason", sup.Reason, "fix", sup.Fix)
	} else {
		log.Info("resources: cgroups", "cgroups", cg.Describe(), "podPidsLimit", cg.PodPidsLimit())
		if sup.Reason != "" {
			log.Warn("resources: some limits are not enforced by cgroups", "enforced", sup.Enforced, "reason", sup.Reason, "fix", sup.Fix)
		}
		favorDynMods(cfg.KeepCgroupAttachMode, log)
	}
	mgr, err := pod.NewManager(pod.Config{DataDir: dataDir, Images: store, Starter: starter, Network: network, Cgroups: cg, ShimPath: cfg.ShimPath, DisableSandbox: cfg.DisableSandbox,
		DNSShimLib:           filepath.Join(filepath.Dir(cfg.ShimPath), pod.DNSShimLibName),
		CrashLoopBackOffBase: cfg.CrashLoopBackOffBase, CrashLoopBackOffMax: cfg.CrashLoopBackOffMax,
		BackOffResetAfter: cfg.BackOffResetAfter, ImagePullBackOffBase: cfg.ImagePullBackOffBase,
		ImagePullBackOffMax: cfg.ImagePullBackOffMax, EmptyDirCheckInterval: cfg.EmptyDirCheckInterval,
		ContainerLogMaxSize: cfg.ContainerLogMaxSize, ContainerLogMaxFiles: cfg.ContainerLogMaxFiles, Logger: log})
	if err != nil {
		ln.Close()
		return err
	}
	mctx, stopPods := context.WithCancel(context.Background())
	defer stopPods()
	if err := mgr.Start(mctx); err != nil {
		ln.Close()
		return err
	}
	srv := &server{cfg: cfg, mgr: mgr, store: store, log: log, cloneMethod: podRoots(cfg, dirs.PodsDir()), netd: netd, cgroups: cg}
	g := grpc.NewServer()
	runtimev1.RegisterRuntimeServer(g, srv)
	runtimev1.RegisterImagesServer(g, &imagesServer{store: store, pods: mgr.List})
	errc := make(chan error, 2)
	go func() { errc <- g.Serve(ln) }()
	go srv.runMemoryEviction(mctx)
	if cfg.RegistryPort > 0 {
		go func() {
			if err := registry.Serve(ctx, store, dirs.RegistryJournalDir(), cfg.RegistryPort, log); err != nil {
				errc <- err
			}
		}()
	}
	log.Info("runtime daemon serving", "socket", cfg.Socket, "dataDir", dataDir, "shim", cfg.ShimPath, "clone", srv.cloneMethod)
	if cfg.OnReady != nil {
		cfg.OnReady()
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		stopPods()
		mgr.Wait()
		return fmt.Errorf("runtime daemon: serve: %w", err)
	}
	// Streams (watch, follow) never end by themselves: give unary calls a
	// moment, then cut.
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		g.Stop()
	}
	stopPods()
	mgr.Wait()
	log.Info("runtime daemon stopped; pods keep running")
	return nil
}

// listen creates the socket 0600 in a 0700 directory.
// lockWait is how long a starting daemon waits for its data dir's lock.
const lockWait = 10 * time.Second

func listen(socket string) (net.Listener, error) {
	dir := filepath.Dir(socket)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("runtime daemon: Config.Socket directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("runtime daemon: Config.Socket directory %s has mode %04o: it must be private (0700) so only its owner reaches the runtime; chmod 0700 it or choose another directory", dir, fi.Mode().Perm())
	}
	if fi, err := os.Lstat(socket); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("runtime daemon: Config.Socket %s exists and is not a socket; refusing to replace it", socket)
		}
		os.Remove(socket) // stale, from a daemon that died (we hold the lock)
	}
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("runtime daemon: listen on %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// findShim resolves the shim binary.
func findShim(path string) (string, error) {
	if path == "" {
		// Beside the executable, where the server finds its helpers too.
		beside := errors.New("the running executable is unknown")
		if exe, err := os.Executable(); err == nil {
			p, err := supervisor.Beside(exe, "k3sm-shim")
			if err == nil {
				return p, nil
			}
			beside = err
		}
		p, err := exec.LookPath("k3sm-shim")
		if err != nil {
			return "", fmt.Errorf("runtime daemon: Config.ShimPath is empty and no k3sm-shim is on $PATH: %w", beside)
		}
		path = p
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(abs)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("runtime daemon: Config.ShimPath %s is not an executable file", path)
	}
	return abs, nil
}

// podRoots says how pod roots are made here: an overlay of the image in
// the sandbox (image pods of a root runtime on Linux), else the data dir's
// clone method (a reflink clone, or a copy).
func podRoots(cfg Config, podsDir string) string {
	if sandbox.Available() && !cfg.DisableSandbox {
		return "overlay"
	}
	return string(clone.Probe(podsDir))
}

// favorDynMods sets the host's cgroup2 favordynmods (a daemon run as root,
// unless keep): every container's init joins its cgroups, and without it
// each join waits for an RCU grace period (package cgroups).
func favorDynMods(keep bool, log *slog.Logger) {
	if keep || os.Geteuid() != 0 {
		mode, _ := cgroups.ReadAttachMode("/proc/self/mountinfo")
		log.Info("cgroup attach mode: the host's", "mode", mode.Describe())
		return
	}
	mode, err := cgroups.FavorDynamicChanges()
	if err != nil {
		log.Warn("cgroup attach mode: each container start waits for the kernel", "err", err)
		return
	}
	log.Info("cgroup attach mode", "mode", mode.Describe())
}
