package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/sirupsen/logrus"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	logruslogger "github.com/virtual-kubelet/virtual-kubelet/log/logrus"
)

// Main is the node role's entry point (`k3sm node --config=<file>`, started
// by the supervisor); it returns the exit code.
func Main(args []string) int {
	supervisor.RunAsChild()
	var cfg Config
	if err := roleconfig.Read(roleconfig.Node, args, &cfg.NodeConfig); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Virtual Kubelet logs through its own facade; send it to our log file.
	l := logrus.New()
	l.SetOutput(os.Stderr)
	vklog.L = logruslogger.FromLogrus(logrus.NewEntry(l))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		return 1
	}
	return 0
}
