// Package upstream runs the upstream programs linked into the k3sm binary:
// kube-apiserver, kube-scheduler, kube-controller-manager and kine as hidden
// roles the supervisor re-executes the binary with (`k3sm kube-apiserver
// ...`), and kubectl for `k3sm kubectl`. It is the only package that
// imports k8s.io/kubernetes' commands; keep tests out of it, since linking
// the control plane takes minutes.
package upstream

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/k3s-io/kine/pkg/endpoint"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
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

// Roles are the entry points of the upstream hidden roles, by role name.
func Roles() map[string]func(args []string) int {
	return map[string]func([]string) int{
		roleconfig.Kine:              runKine,
		roleconfig.APIServer:         runCobra(apiserverapp.NewAPIServerCommand),
		roleconfig.Scheduler:         runCobra(func() *cobra.Command { return schedulerapp.NewSchedulerCommand() }),
		roleconfig.ControllerManager: runCobra(cmapp.NewControllerManagerCommand),
	}
}

func runCobra(newCmd func() *cobra.Command) func([]string) int {
	return func(args []string) int {
		supervisor.ExitWithParent()
		cmd := newCmd()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	}
}

func runKine(args []string) int {
	supervisor.ExitWithParent()
	var kc roleconfig.KineConfig
	if err := roleconfig.Read(roleconfig.Kine, args, &kc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	logrus.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The defaults of kine's own CLI, passed explicitly because the library
	// has no defaults of its own.
	cfg := endpoint.Config{
		Listener:            kc.Listen,
		Endpoint:            kc.Endpoint,
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
