// Package roles owns the hidden roles of the k3sm binary: the upstream
// Kubernetes components, kine and kubectl, linked in and run when the
// supervisor re-executes the binary (`k3sm kube-apiserver ...`). It is the
// only package that imports k8s.io/kubernetes; keep tests out of it, since
// linking the control plane takes minutes.
package upstream

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/k3s-io/kine/pkg/endpoint"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/agent/node"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // exec and OIDC credential plugins for kubectl
)

// Lookup returns the entry point of a hidden role.
func Lookup(name string) (func(args []string) int, bool) {
	run, ok := map[string]func([]string) int{
		controlplane.RoleKine:              runKine,
		controlplane.RoleAPIServer:         runCobra(apiserverapp.NewAPIServerCommand),
		controlplane.RoleScheduler:         runCobra(func() *cobra.Command { return schedulerapp.NewSchedulerCommand() }),
		controlplane.RoleControllerManager: runCobra(cmapp.NewControllerManagerCommand),
		node.RoleRuntime:                   runRuntimed,
		node.RoleNode:                      runNode,
	}[name]
	return run, ok
}

// exitWithParent ends a supervised child as soon as its supervisor is gone.
func exitWithParent() {
	supervisor.WatchParent(func() {
		fmt.Fprintln(os.Stderr, "k3sm: supervisor exited; stopping")
		os.Exit(1)
	})
}

func runCobra(newCmd func() *cobra.Command) func([]string) int {
	return func(args []string) int {
		exitWithParent()
		cmd := newCmd()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	}
}

func runKine(args []string) int {
	exitWithParent()
	fs := flag.NewFlagSet("kine", flag.ContinueOnError)
	listen := fs.String("listen-address", "unix://kine.sock", "where kine serves the etcd API")
	ep := fs.String("endpoint", "", "datastore endpoint (sqlite://path?params)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	logrus.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The defaults of kine's own CLI, passed explicitly because the library
	// has no defaults of its own.
	cfg := endpoint.Config{
		Listener:            *listen,
		Endpoint:            *ep,
		NotifyInterval:      5 * time.Second,
		EmulatedETCDVersion: "3.6.11",
		CompactTimeout:      5 * time.Second,
		CompactMinRetain:    1000,
		CompactBatchSize:    1000,
		PollBatchSize:       500,
		PollInterval:        time.Second,
	}
	cfg.ConnectionPoolConfig.MaxIdle = 20
	cfg.ConnectionPoolConfig.MaxIdleTime = 2 * time.Minute
	var wg sync.WaitGroup
	cfg.WaitGroup = &wg
	if _, err := endpoint.Listen(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "kine:", err)
		return 1
	}
	<-ctx.Done()
	// Wait for kine to drain and close the datastore, but no longer than
	// its own graceful-stop limit.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(endpoint.GracefulStopTimeout + time.Second):
	}
	return 0
}

// Kubectl runs the embedded kubectl with args (without the leading
// "kubectl"), with $KUBECONFIG set to kubeconfig unless that is empty
// (k3smcmd decides which one).
func Kubectl(args []string, kubeconfig string) int {
	if kubeconfig != "" {
		os.Setenv("KUBECONFIG", kubeconfig)
	}
	os.Args = append([]string{"kubectl"}, args...)
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}
