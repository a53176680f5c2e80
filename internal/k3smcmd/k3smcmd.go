// Package k3smcmd owns the user-facing command line of the k3sm binary:
// `server`, `kubeconfig`, `kubectl` and `version`, and the operations
// (ops.go): `snapshot`, `secrets-encrypt`, `certificate`, `status`,
// `doctor`, `image`, `install` and `uninstall`. Hidden component roles are
// dispatched before this, by cmd/k3sm.
package k3smcmd

import (
	"context"
	"errors"
	"fmt"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/k3sm-dev/k3sm/internal/version"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/natefinch/lumberjack.v2"
)

// Kubectl runs the embedded kubectl with args and, unless kubeconfig is
// empty, $KUBECONFIG set to it; cmd/k3sm wires it to internal/roles so that
// this package stays free of the control plane's imports.
type Kubectl func(args []string, defaultKubeconfig string) int

// Upstream is what cmd/k3sm wires in from internal/upstream, the only
// package that links the upstream commands.
type Upstream struct {
	Kubectl Kubectl
	// Flags returns an upstream component's flags by role name, so `server`
	// checks --kube-*-arg before it starts anything; nil skips that check.
	Flags func(role string) *pflag.FlagSet
}

// Addons returns what `k3sm server` starts after the control plane is verified.
type Addons func(cfg *controlplane.Config) []controlplane.Addon

// New returns the root command.
func New(up Upstream, addons Addons) *cobra.Command {
	root := &cobra.Command{
		Use:           "k3sm",
		Short:         "A whole Kubernetes distribution in one binary; pods run as native host processes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServer(up, addons), newKubeconfig(), newKubectl(up.Kubectl), newVersion())
	addOps(root)
	return root
}

// Execute runs the root command and returns the process exit code.
func Execute(up Upstream, addons Addons) int {
	if err := New(up, addons).Execute(); err != nil {
		var code exitCode
		if errors.As(err, &code) {
			return int(code)
		}
		fmt.Fprintln(os.Stderr, "k3sm:", err)
		return 1
	}
	return 0
}

func newServer(up Upstream, addons Addons) *cobra.Command {
	cfg := controlplane.Defaults()
	cfg.ComponentFlags = up.Flags
	var dc deployConfig
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the control plane and this machine's node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			datastoreFromEnv(&cfg)
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Executable = exe
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := os.MkdirAll(datadir.New(cfg.DataDir).LogDir(), 0o700); err != nil {
				return &controlplane.FieldError{Flag: "data-dir", Value: cfg.DataDir, Problem: "not writable: " + err.Error(),
					Fix: "run as root for /var/lib/k3sm or pass --data-dir under your home"}
			}
			// Rotated as the components' logs are (supervisor.DefaultLogMaxSizeMB).
			logf := &lumberjack.Logger{Filename: datadir.New(cfg.DataDir).ServerLog(),
				MaxSize: supervisor.DefaultLogMaxSizeMB, MaxBackups: supervisor.DefaultLogMaxBackups, Compress: true}
			defer logf.Close()
			log := slog.New(slog.NewTextHandler(io.MultiWriter(os.Stderr, logf), &slog.HandlerOptions{Level: logLevel()}))
			var extra []controlplane.Addon
			if addons != nil {
				extra = addons(&cfg)
			}
			extra = append([]controlplane.Addon{opsAddon(), deployAddon(&dc)}, extra...)
			return controlplane.Run(ctx, cfg, log, extra...)
		},
	}
	serverFlags(cmd.Flags(), &cfg, &dc)
	return cmd
}

// DatastoreEndpointEnv sets --datastore-endpoint, as K3S_DATASTORE_ENDPOINT
// does k3s's: the way to keep its password off the command line, and how
// `k3sm install` passes it to the service.
const DatastoreEndpointEnv = "K3SM_DATASTORE_ENDPOINT"

// datastoreFromEnv fills --datastore-endpoint from the environment when
// the flag is not given (never as the flag's default: --help would show it).
func datastoreFromEnv(cfg *controlplane.Config) {
	if cfg.Datastore.Endpoint == "" {
		cfg.Datastore.Endpoint = os.Getenv(DatastoreEndpointEnv)
	}
	if cfg.Token == "" {
		cfg.Token = os.Getenv(AgentTokenEnv)
	}
}

// serverFlags are the flags of `k3sm server`; `k3sm install` takes them too
// and persists the ones given in the service.
func serverFlags(f *pflag.FlagSet, cfg *controlplane.Config, dc *deployConfig) {
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the datastore, certificates, logs and pods")
	f.IntVar(&cfg.HTTPSPort, "https-listen-port", cfg.HTTPSPort, "apiserver port")
	f.IntVar(&cfg.SupervisorPort, "supervisor-port", cfg.SupervisorPort, "port of the join endpoint (HTTPS, on --bind-address) that `k3sm agent` joins through; 0: off")
	f.IntVar(&cfg.MeshPort, "mesh-port", cfg.MeshPort, "UDP port of this node's WireGuard mesh device, which carries pod traffic between nodes (needs the pod network); 0: no mesh")
	f.StringVar(&cfg.BindAddress, "bind-address", cfg.BindAddress, "address the apiserver listens on")
	f.StringVar(&cfg.AdvertiseAddress, "advertise-address", "", "address advertised for the apiserver (default: the bind address, or the host's first IPv4)")
	f.StringVar(&cfg.ServiceCIDR, "service-cidr", cfg.ServiceCIDR, "IPv4 range for Service cluster IPs")
	f.StringVar(&cfg.ClusterCIDR, "cluster-cidr", cfg.ClusterCIDR, "IPv4 range for Pod IPs; each node gets a /24, or the larger range its --max-pods needs")
	f.StringVar(&cfg.ClusterDNS, "cluster-dns", cfg.ClusterDNS, "cluster DNS Service address (inside --service-cidr)")
	f.StringVar(&cfg.ClusterDomain, "cluster-domain", cfg.ClusterDomain, "cluster DNS domain")
	f.StringSliceVar(&cfg.TLSSANs, "tls-san", nil, "extra host name or IP for the apiserver certificate (repeatable)")
	f.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "this machine's node name")
	f.StringVar(&cfg.NodeIP, "node-ip", "", "this node's address (default: the advertise address)")
	f.IntVar(&cfg.KubeletPort, "kubelet-port", cfg.KubeletPort, "port of this node's kubelet API")
	f.IntVar(&cfg.RegistryPort, "registry-port", 0, "serve a node-local OCI registry backed by the image store on 127.0.0.1:PORT (0: off); pods run images pushed there")
	f.IntVar(&cfg.MaxPods, "max-pods", cfg.MaxPods, "pods this node runs at most (the kubelet's --max-pods)")
	f.Int64Var(&cfg.PodMaxPids, "pod-max-pids", cfg.PodMaxPids, "processes and threads each pod may have at once (cgroup pids.max; the kubelet's --pod-max-pids); -1: no limit")
	f.StringVar(&cfg.DNSConfig, "dns-config", "", "file of per-domain forwards for the cluster DNS (forward: [{domain: corp.example, servers: [192.0.2.53]}])")
	f.StringVar(&cfg.PodNetwork, "pod-network", cfg.PodNetwork, "auto: a network namespace and IP per pod (k3sm-netd) when run as root on Linux, else the node's network; netns: require it; host: pods share the node's network")
	f.StringVar(&cfg.NetdSocket, "netd-socket", "", "use the k3sm-netd serving this socket, run apart as root, instead of starting one: pods get their own network while k3sm itself is not root (its uid must be netd's allowedUID)")
	f.StringVar(&cfg.ServiceProxy, "service-proxy", cfg.ServiceProxy, "auto: Services in the kernel (nftables DNAT by k3sm-netd: ClusterIPs, externalIPs, NodePort and LoadBalancer on a non-loopback node address) when the pod network is on, else the userspace relay; nftables: require it; userspace: the relay serves every Service")
	f.BoolVar(&cfg.NodeTaint, "node-taint", cfg.NodeTaint,
		"taint this node k3sm.io/provider=native:NoSchedule, so only pods that tolerate it run here (on by default on nodes other than Linux)")
	f.BoolVar(&cfg.CgroupFavorDynMods, "cgroup-favordynmods", cfg.CgroupFavorDynMods,
		"Linux, runtime as root: set the host's cgroup2 favordynmods option (kernel 6.1+), so that placing a container's first process in its cgroups skips an RCU grace period (6-12 ms); false leaves the host's setting")
	f.StringVar(&cfg.Datastore.Endpoint, datastore.FlagEndpoint, "", "($"+DatastoreEndpointEnv+") an existing database to keep the cluster in instead of the embedded SQLite: postgres://USER:PASSWORD@HOST:5432/DB, mysql://USER:PASSWORD@tcp(HOST:3306)/DB, or etcd's https://HOST:2379 (several comma-separated)")
	f.StringVar(&cfg.Datastore.CAFile, datastore.FlagCAFile, "", "CA certificate that signs the datastore's server certificate")
	f.StringVar(&cfg.Datastore.CertFile, datastore.FlagCertFile, "", "client certificate for the datastore")
	f.StringVar(&cfg.Datastore.KeyFile, datastore.FlagKeyFile, "", "key of --datastore-certfile")
	f.StringVar(&cfg.Token, "token", "", "($"+AgentTokenEnv+") join the cluster that lives in --datastore-endpoint as one more server: a token from `k3sm token create` on one of its servers (only the first start of a data dir reads it)")
	f.BoolVar(&cfg.ClusterInit, "cluster-init", false, "make a new cluster kept in an embedded etcd member of this server (instead of SQLite), which more servers join with --server and --token")
	f.StringVar(&cfg.Server, "server", "", "join the cluster with embedded etcd of the server at https://HOST:9345 (its join endpoint) as one more server and etcd member; needs --token")
	f.IntVar(&cfg.EtcdClientPort, "etcd-client-port", cfg.EtcdClientPort, "client port of the embedded etcd member (--cluster-init)")
	f.IntVar(&cfg.EtcdPeerPort, "etcd-peer-port", cfg.EtcdPeerPort, "peer port of the embedded etcd member (--cluster-init); the servers reach each other's on it")
	f.BoolVar(&cfg.DisableAgent, "disable-agent", false, "run the control plane without a node of this machine: no pods, runtime, pod network or metrics.k8s.io here")
	f.StringVar(&cfg.RegistriesConfig, "registries-config", "", "registries.yaml with mirrors, plain-HTTP endpoints and auth (default <data-dir>/registries.yaml)")
	if cfg.ExtraArgs == nil {
		cfg.ExtraArgs = map[string][]string{}
	}
	for _, role := range []string{roleconfig.APIServer, roleconfig.Scheduler, roleconfig.ControllerManager} {
		f.Var(&extraArgsValue{m: cfg.ExtraArgs, role: role}, controlplane.ExtraArgFlags[role],
			"extra flag for "+role+" as NAME=VALUE, replacing k3sm's value of it; NAME+=VALUE appends to k3sm's list (repeatable)")
	}
	addDiskFlags(f, &cfg.Disk)
	addOpsFlags(f, &cfg.Ops)
	addDeployFlags(f, dc)
	f.BoolVar(&cfg.NodeInstant, "node-instant", false, "benchmark floor: the node marks pods Running without starting anything")
	_ = f.MarkHidden("node-instant")
	f.Var(instantWritesValue{cfg}, "node-instant-writes", "benchmark fair floor: as --node-instant, but the node makes a real start's API writes (token, Pulled/Created/Started, two statuses)")
	f.Lookup("node-instant-writes").NoOptDefVal = "true"
	_ = f.MarkHidden("node-instant-writes")
	f.IntVar(&cfg.SchedulerPort, "scheduler-port", cfg.SchedulerPort, "loopback port of the scheduler's health endpoint")
	f.IntVar(&cfg.ControllerManagerPort, "controller-manager-port", cfg.ControllerManagerPort, "loopback port of the controller-manager's health endpoint")
	_ = f.MarkHidden("scheduler-port")
	_ = f.MarkHidden("controller-manager-port")
}

func newKubeconfig() *cobra.Command {
	var dataDir, output string
	var merge, setCurrent bool
	cmd := &cobra.Command{
		Use:   "kubeconfig",
		Short: "Print the admin kubeconfig, or merge it into ~/.kube/config",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := datadir.New(dataDir).AdminKubeconfig()
			data, err := os.ReadFile(path)
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("no admin kubeconfig at %s: start `k3sm server` first (or pass --data-dir)", path)
			} else if err != nil {
				return err
			}
			if !merge {
				_, err := cmd.OutOrStdout().Write(data)
				return err
			}
			if output == "" {
				home, err := os.UserHomeDir()
				if err != nil {
					return err
				}
				output = filepath.Join(home, ".kube", "config")
			}
			backup, err := kubeconfig.Merge(output, data, kubeconfig.MergeOptions{SetCurrentContext: setCurrent})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "merged context %q into %s", "k3sm", output)
			if backup != "" {
				fmt.Fprintf(cmd.OutOrStdout(), " (backup %s)", backup)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", controlplane.DefaultDataDir(), "the server's data directory")
	cmd.Flags().BoolVar(&merge, "merge", false, "merge into a kubeconfig file instead of printing")
	cmd.Flags().StringVar(&output, "kubeconfig", "", "file to merge into (default ~/.kube/config)")
	cmd.Flags().BoolVar(&setCurrent, "set-current", true, "with --merge: make the k3sm context current")
	return cmd
}

func newKubectl(run Kubectl) *cobra.Command {
	return &cobra.Command{
		Use:                "kubectl",
		Short:              "Run the embedded kubectl (uses the admin kubeconfig unless told otherwise)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			home, _ := os.UserHomeDir()
			rest, kc, note, err := kubectlTarget(args, os.Getenv, home)
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), err)
				os.Exit(1)
			}
			if note != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), note)
			}
			os.Exit(run(rest, kc))
			return nil
		},
	}
}

func newVersion() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print versions",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "k3sm %s (%s)\nKubernetes %s\n", version.Version, version.GitCommit, version.Kubernetes)
		},
	}
}

// logLevel is debug when K3SM_DEBUG is set.
func logLevel() slog.Level {
	if os.Getenv("K3SM_DEBUG") != "" {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// extraArgsValue is a repeatable --kube-*-arg flag that collects into
// Config.ExtraArgs; it is a pflag.SliceValue so `install` persists each value.
type extraArgsValue struct {
	m    map[string][]string
	role string
}

// String is empty when unset, so --help shows no "(default [])".
func (v *extraArgsValue) String() string {
	if len(v.m[v.role]) == 0 {
		return ""
	}
	return "[" + strings.Join(v.m[v.role], ",") + "]"
}
func (v *extraArgsValue) Type() string { return "stringArray" }
func (v *extraArgsValue) Set(s string) error {
	v.m[v.role] = append(v.m[v.role], s)
	return nil
}
func (v *extraArgsValue) Append(s string) error { return v.Set(s) }
func (v *extraArgsValue) Replace(ss []string) error {
	v.m[v.role] = append([]string(nil), ss...)
	return nil
}
func (v *extraArgsValue) GetSlice() []string { return append([]string(nil), v.m[v.role]...) }

// instantWritesValue is --node-instant-writes, which implies --node-instant.
type instantWritesValue struct{ cfg *controlplane.Config }

func (v instantWritesValue) String() string {
	if v.cfg == nil {
		return "false"
	}
	return strconv.FormatBool(v.cfg.NodeInstantWrites)
}

func (v instantWritesValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	v.cfg.NodeInstantWrites = b
	v.cfg.NodeInstant = v.cfg.NodeInstant || b
	return nil
}

func (instantWritesValue) Type() string { return "bool" }
