package daemon

import (
	"context"
	"fmt"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/runtime/pressure"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/k3sm-dev/k3sm/internal/version"
)

// Main is the runtime daemon role's entry point (`k3sm-runtimed
// --config=<file>`, started by the supervisor); it returns the exit code.
func Main(args []string) int {
	supervisor.RunAsChild()
	var rc roleconfig.RuntimeConfig
	if err := roleconfig.Read(roleconfig.Runtime, args, &rc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg, err := configFromRole(rc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "runtimed:", err)
		return 2
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "runtimed:", err)
		return 1
	}
	return 0
}

// configFromRole maps the role config onto Config: a container log size of
// 0 in the disk policy turns rotation off (Config's negative size).
func configFromRole(rc roleconfig.RuntimeConfig) (Config, error) {
	size, err := rc.Disk.ContainerLogMaxBytes()
	if err != nil {
		return Config{}, fmt.Errorf("disk.containerLogMaxSize: %w", err)
	}
	if size == 0 {
		size = -1
	}
	mem, ok, err := pressure.FromPolicy(rc.Disk.EvictionHard)
	if err != nil {
		return Config{}, fmt.Errorf("disk.evictionHard (--eviction-hard): %w", err)
	}
	var memThreshold *pressure.Threshold
	if ok {
		memThreshold = &mem
	}
	return Config{DataDir: rc.DataDir, MemoryThreshold: memThreshold, HousekeepingInterval: rc.Disk.HousekeepingInterval, Socket: rc.Socket, RegistriesFile: rc.RegistriesFile, MaxPods: rc.MaxPods, RegistryPort: rc.RegistryPort,
		NetdSocket: rc.NetdSocket, NoPodNetworkReason: rc.NoPodNetworkReason, ServiceCIDR: rc.ServiceCIDR, ClusterCIDR: rc.ClusterCIDR, KeepCgroupAttachMode: rc.KeepCgroupAttachMode,
		Cgroups:             cgroups.Options{PodPidsLimit: rc.PodPidsLimit},
		ContainerLogMaxSize: size, ContainerLogMaxFiles: rc.Disk.ContainerLogMaxFiles, Version: version.Version}, nil
}
