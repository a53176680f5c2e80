// Command local-path is the storage provisioner of the klimax node image: it
// runs k3sm's local-path Provisioner (internal/agent/localpath) for the node
// it is scheduled on, in-cluster, so a kind cluster's default StorageClass
// "local-path" works without pulling a third-party provisioner.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/k3sm-dev/k3sm/internal/agent/localpath"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "local-path:", err)
		os.Exit(1)
	}
}

func run() error {
	node := os.Getenv("NODE_NAME")
	if node == "" {
		return fmt.Errorf("NODE_NAME is empty: set it from the pod's spec.nodeName (downward API)")
	}
	base := os.Getenv("BASE_DIR")
	if base == "" {
		base = "/var/local-path-provisioner"
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	p := &localpath.Provisioner{Client: client, NodeName: node, BaseDir: base, Log: slog.Default()}
	return p.Run(ctx)
}
