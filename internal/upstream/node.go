package upstream

import (
	"context"
	"flag"
	"fmt"
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/k3sm-dev/k3sm/internal/agent/metrics"
	"github.com/k3sm-dev/k3sm/internal/agent/node"
	"github.com/k3sm-dev/k3sm/internal/runtime/daemon"
	"github.com/k3sm-dev/k3sm/internal/version"
	"github.com/sirupsen/logrus"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	logruslogger "github.com/virtual-kubelet/virtual-kubelet/log/logrus"
)

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

func runRuntimed(args []string) int {
	exitWithParent()
	fs := flag.NewFlagSet(node.RoleRuntime, flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "k3sm data directory")
	socket := fs.String("socket", "", "gRPC socket")
	registries := fs.String("registries-config", "", "registries.yaml")
	maxPods := fs.Int64("max-pods", 110, "pods this node runs at most")
	logMaxSize := fs.Int64("container-log-max-size", 0, "rotate a container log at this many bytes (0: 10 MiB, negative: never)")
	logMaxFiles := fs.Int("container-log-max-files", 0, "container log files kept, the live one included (0: 5)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signalContext()
	defer stop()
	err := daemon.Run(ctx, daemon.Config{
		DataDir: *dataDir, Socket: *socket, RegistriesFile: *registries, MaxPods: *maxPods, Version: version.Version,
		ContainerLogMaxSize: *logMaxSize, ContainerLogMaxFiles: *logMaxFiles,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "runtimed:", err)
		return 1
	}
	return 0
}

func runNode(args []string) int {
	exitWithParent()
	fs := flag.NewFlagSet(node.RoleNode, flag.ContinueOnError)
	var cfg node.Config
	fs.StringVar(&cfg.Name, "node-name", "", "node name")
	fs.StringVar(&cfg.IP, "node-ip", "", "node address")
	fs.IntVar(&cfg.KubeletPort, "kubelet-port", 10250, "kubelet API port")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "the node's kubeconfig")
	fs.StringVar(&cfg.ServingCert, "tls-cert-file", "", "kubelet API serving certificate")
	fs.StringVar(&cfg.ServingKey, "tls-private-key-file", "", "kubelet API serving key")
	fs.StringVar(&cfg.ClientCAFile, "client-ca-file", "", "CA of accepted kubelet API clients")
	fs.StringVar(&cfg.RuntimeSocket, "runtime-socket", "", "runtime daemon socket")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "k3sm's data directory (never a hostPath volume)")
	fs.StringVar(&cfg.LocalPathKubeconfig, "local-path-kubeconfig", "", "the local-path provisioner's kubeconfig (off when empty)")
	fs.StringVar(&cfg.LocalPathDir, "local-path-dir", "", "where local-path volumes are made")
	fs.BoolVar(&cfg.Instant, "instant", false, "benchmark floor: mark pods Running without starting them")
	metrics.AddFlags(fs, &cfg.Metrics)
	cfg.Disk = diskpolicy.Default()
	fs.IntVar(&cfg.Disk.ImageGCHighThresholdPercent, "image-gc-high-threshold", cfg.Disk.ImageGCHighThresholdPercent, "image GC starts above this percent of the image filesystem in use")
	fs.IntVar(&cfg.Disk.ImageGCLowThresholdPercent, "image-gc-low-threshold", cfg.Disk.ImageGCLowThresholdPercent, "image GC frees down to this percent")
	fs.DurationVar(&cfg.Disk.ImageMinimumGCAge, "image-minimum-gc-age", cfg.Disk.ImageMinimumGCAge, "minimum age of an image GC removes")
	fs.DurationVar(&cfg.Disk.ImageGCPeriod, "image-gc-period", cfg.Disk.ImageGCPeriod, "how often image GC runs")
	fs.StringVar(&cfg.Disk.EvictionHard, "eviction-hard", cfg.Disk.EvictionHard, "disk thresholds of DiskPressure")
	fs.DurationVar(&cfg.Disk.EvictionPressureTransitionPeriod, "eviction-pressure-transition-period", cfg.Disk.EvictionPressureTransitionPeriod, "DiskPressure stays True this long after the last crossing")
	fs.DurationVar(&cfg.Disk.HousekeepingInterval, "housekeeping-interval", cfg.Disk.HousekeepingInterval, "how often the disk is measured")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Virtual Kubelet logs through its own facade; send it to our log file.
	l := logrus.New()
	l.SetOutput(os.Stderr)
	vklog.L = logruslogger.FromLogrus(logrus.NewEntry(l))
	ctx, stop := signalContext()
	defer stop()
	if err := node.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		return 1
	}
	return 0
}
