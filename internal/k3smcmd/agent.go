package k3smcmd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	goruntime "runtime"
	"strings"
	"syscall"

	"github.com/k3sm-dev/k3sm/internal/agent/agent"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/natefinch/lumberjack.v2"
)

// Environment variables `k3sm agent` reads when the flags are not given,
// as k3s reads K3S_URL and K3S_TOKEN: the token stays off the command line.
const (
	AgentServerEnv = "K3SM_URL"
	AgentTokenEnv  = "K3SM_TOKEN"
)

// agentDefaults is `k3sm agent`'s configuration before its flags.
func agentDefaults() agent.Config {
	host, _ := os.Hostname()
	return agent.Config{DataDir: controlplane.DefaultDataDir(), NodeName: strings.ToLower(host), KubeletPort: 10250, MeshPort: controlplane.DefaultMeshPort, MaxPods: 110, LBPort: agent.DefaultLBPort,
		PodMaxPids: cgroups.DefaultPodPidsLimit, PodNetwork: "auto", NodeTaint: controlplane.DefaultNodeTaint(goruntime.GOOS), Disk: diskpolicy.Default()}
}

func newAgent() *cobra.Command {
	cfg := agentDefaults()
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Join this machine to a k3sm server's cluster as a node",
		Long: "Joins the cluster of the server at --server with a token from `k3sm token create` there, then runs this\n" +
			"machine's node (runtime, pod network, Service proxy, DNS) as the server's own node runs. It joins again\n" +
			"at every start; pods keep running across restarts of the agent and of the server.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Server == "" {
				cfg.Server = os.Getenv(AgentServerEnv)
			}
			if cfg.Token == "" {
				cfg.Token = os.Getenv(AgentTokenEnv)
			}
			if err := checkDisk(cfg.Disk); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Executable = exe
			l := datadir.New(cfg.DataDir)
			if err := os.MkdirAll(l.LogDir(), 0o700); err != nil {
				return err
			}
			logf := &lumberjack.Logger{Filename: l.ServerLog(),
				MaxSize: supervisor.DefaultLogMaxSizeMB, MaxBackups: supervisor.DefaultLogMaxBackups, Compress: true}
			defer logf.Close()
			log := slog.New(slog.NewTextHandler(io.MultiWriter(os.Stderr, logf), &slog.HandlerOptions{Level: logLevel()}))
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return agent.Run(ctx, cfg, log)
		},
	}
	agentFlags(cmd.Flags(), &cfg)
	return cmd
}

// checkDisk checks the disk flags, naming each one at fault.
func checkDisk(d diskpolicy.Config) error {
	var errs []error
	d.Validate(func(flag, value, problem, fix string) {
		errs = append(errs, &controlplane.FieldError{Flag: flag, Value: value, Problem: problem, Fix: fix})
	})
	return errors.Join(errs...)
}

// agentFlags are `k3sm agent`'s flags (also what `k3sm install --agent`
// persists and checks).
func agentFlags(f *pflag.FlagSet, cfg *agent.Config) {
	f.StringVar(&cfg.Server, "server", "", "($"+AgentServerEnv+") the server's join endpoint, https://HOST:9345 (its --supervisor-port)")
	f.StringVar(&cfg.Token, "token", "", "($"+AgentTokenEnv+") a join token: the last line of `k3sm token create` on the server")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for this node's credentials, logs, images and pods")
	f.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "this machine's node name")
	f.StringVar(&cfg.NodeIP, "node-ip", "", "this node's address (default: the one this machine reaches the server from)")
	f.IntVar(&cfg.KubeletPort, "kubelet-port", cfg.KubeletPort, "port of this node's kubelet API")
	f.IntVar(&cfg.LBPort, "lb-server-port", cfg.LBPort, "loopback port of the load balancer through which this node reaches the cluster's apiservers (it follows them, so losing one server disconnects nothing)")
	f.StringVar(&cfg.NetdSocket, "netd-socket", "", "use this k3sm-netd, run apart as root (k3sm install's unit), instead of starting one: the agent then runs unprivileged")
	f.IntVar(&cfg.MeshPort, "mesh-port", cfg.MeshPort, "UDP port of this node's WireGuard mesh device, which carries pod traffic between nodes; 0: no mesh")
	f.IntVar(&cfg.MaxPods, "max-pods", cfg.MaxPods, "pods this node runs at most (the kubelet's --max-pods)")
	f.Int64Var(&cfg.PodMaxPids, "pod-max-pids", cfg.PodMaxPids, "processes and threads each pod may have at once (cgroup pids.max); -1: no limit")
	f.StringVar(&cfg.PodNetwork, "pod-network", cfg.PodNetwork, "auto: a network namespace and IP per pod (k3sm-netd) when run as root on Linux, else the node's network; netns: require it; host: pods share the node's network")
	f.BoolVar(&cfg.NodeTaint, "node-taint", cfg.NodeTaint, "taint this node k3sm.io/provider=native:NoSchedule (on by default on nodes other than Linux)")
	addDiskFlags(f, &cfg.Disk)
}
