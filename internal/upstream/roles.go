// Package upstream runs the upstream programs linked into the k3sm binary:
// kube-apiserver (with kine in its process: kine.go), kube-scheduler,
// kube-controller-manager (alone, or both in one process: controllers.go)
// and kine alone, as hidden roles the supervisor re-executes the binary
// with (`k3sm kube-apiserver ...`), and kubectl for `k3sm kubectl`. It is the only package that
// imports k8s.io/kubernetes' commands; keep tests out of it, since linking
// the control plane takes minutes.
package upstream

import (
	"os"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
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
		roleconfig.Etcd:              runEtcd,
		roleconfig.APIServer:         runAPIServer,
		roleconfig.Scheduler:         runCobra(func() *cobra.Command { return schedulerapp.NewSchedulerCommand() }),
		roleconfig.ControllerManager: runCobra(cmapp.NewControllerManagerCommand),
		roleconfig.Controllers:       runControllers,
	}
}

// Flags returns the flags of an upstream component by role name (nil for
// kine and unknown roles), as its command line parses them.
func Flags(role string) *pflag.FlagSet {
	var cmd *cobra.Command
	switch role {
	case roleconfig.APIServer:
		cmd = apiserverapp.NewAPIServerCommand()
	case roleconfig.Scheduler:
		cmd = schedulerapp.NewSchedulerCommand()
	case roleconfig.ControllerManager:
		cmd = cmapp.NewControllerManagerCommand()
	default:
		return nil
	}
	cmd.SetGlobalNormalizationFunc(cliflag.WordSepNormalizeFunc) // as cli.Run does
	return cmd.Flags()
}

func runCobra(newCmd func() *cobra.Command) func([]string) int {
	return func(args []string) int {
		supervisor.RunAsChild()
		cmd := newCmd()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	}
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
