package k3smcmd

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/k3sm-dev/k3sm/internal/agent/agent"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/server/install"
	"github.com/k3sm-dev/k3sm/internal/version"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func newInstall() *cobra.Command {
	cfg := controlplane.Defaults()
	var (
		binLink, mergeKC, dryRun bool
		kcPath, dataVolume       string
		timeout                  time.Duration
	)
	var dc deployConfig
	srv := pflag.NewFlagSet("server", pflag.ContinueOnError)
	serverFlags(srv, &cfg, &dc)
	// `k3sm agent`'s flags: those the server lacks (--server, --token...)
	// are install's too; agentInstall checks and persists them.
	agentFS := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	agentCfg := agentDefaults()
	agentFlags(agentFS, &agentCfg)
	var asAgent bool
	cmd := &cobra.Command{
		Use:   "install [server flags] | install --agent --server URL --token T [agent flags]",
		Short: "Run k3sm at boot: install the binaries and the service, start it, merge the admin kubeconfig",
		Long: `Install copies k3sm, k3sm-runtimed, k3sm-shim, k3sm-netd and k3sm-helm to ` + install.LibDir + ` (linked from
` + install.BinLink + `), writes the service (Linux: systemd ` + install.SystemdUnit + `, as root; macOS:
the LaunchDaemons ` + install.LabelNetd + ` and ` + install.LabelServer + ` as ` + install.ServiceUser + `), starts it, waits for the
cluster and merges the admin kubeconfig into the invoking user's ~/.kube/config. Every
` + "`k3sm server`" + ` flag given here (for example --secrets-encryption, --pod-network,
--node-name) is persisted in the service. Re-running it updates the service; the server
restarts only when something changed, and pods keep running. ` + "`k3sm uninstall`" + ` removes exactly
what it made (recorded in ` + install.ManifestPath + `).

With --agent it installs ` + "`k3sm agent`" + ` instead (Linux: ` + install.SystemdAgentUnit + `; macOS: ` + install.LabelAgent + `),
which joins the server at --server with the token from ` + "`k3sm token create`" + ` there ($` + AgentTokenEnv + `
works too; the token goes to a file only root reads, never into the unit). It takes ` + "`k3sm agent`" + `'s
flags and waits for this node to be Ready.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataVolume != "" && runtime.GOOS != "darwin" {
				return errors.New("--data-volume: an APFS volume for the data dir exists only on macOS; on Linux mount a file system at the data dir in /etc/fstab")
			}
			o := install.Options{Version: version.Version, NoBinLink: !binLink, DataVolume: dataVolume, Timeout: timeout,
				Out: cmd.OutOrStdout(), Runner: install.ExecRunner{}}
			if asAgent {
				if cmd.Flags().Changed("kubeconfig") {
					return errors.New("--kubeconfig: an agent has no admin kubeconfig to merge (use the server's); leave the flag out")
				}
				mergeKC = false
				a, err := agentInstall(cmd.Flags(), srv)
				if err != nil {
					return err
				}
				o.Role, o.DataDir, o.ServerArgs, o.Environment, o.NodeName = install.RoleAgent, a.DataDir, a.args, a.env, a.NodeName
			} else {
				if err := refuseAgentFlags(cmd.Flags(), srv, agentFS); err != nil {
					return err
				}
				// As given: Validate fills in defaults the server derives itself.
				o.ServerArgs = persistedFlags(cmd.Flags(), srv)
				datastoreFromEnv(&cfg)
				if err := cfg.Validate(); err != nil {
					return err
				}
				o.DataDir, o.Environment, o.DisableAgent = cfg.DataDir, secretEnv(cfg), cfg.DisableAgent
			}
			svc, err := install.NativeFor(o.DataDir)
			if err != nil {
				return err
			}
			if dryRun {
				return printPlan(cmd, svc, o)
			}
			if os.Geteuid() != 0 {
				return errors.New("k3sm install writes the service and " + install.LibDir + ": run it as root (sudo k3sm install ...); --dry-run shows what it would do")
			}
			if err := svc.Available(); err != nil {
				return err
			}
			if err := install.CheckDataDir(o.DataDir); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			if exe, err = filepath.EvalSymlinks(exe); err != nil {
				return err
			}
			o.Source = filepath.Dir(exe)
			if mergeKC {
				u, err := invokingUser()
				if err != nil {
					return err
				}
				o.Kubeconfig = kcPath
				if o.Kubeconfig == "" {
					o.Kubeconfig = filepath.Join(u.HomeDir, ".kube", "config")
				}
				o.KubeconfigUID, _ = strconv.Atoi(u.Uid)
				o.GID, _ = strconv.Atoi(u.Gid)
			}
			if timeout > 0 {
				o.Ready = install.WaitReady(svc)
			}
			return install.Install(cmd.Context(), svc, o)
		},
	}
	f := cmd.Flags()
	f.AddFlagSet(srv)
	agentFS.VisitAll(func(a *pflag.Flag) {
		if srv.Lookup(a.Name) == nil {
			f.AddFlag(a)
		}
	})
	f.BoolVar(&asAgent, "agent", false, "install `k3sm agent` (with --server and --token) instead of the server")
	f.BoolVar(&binLink, "bin-link", true, "link "+install.BinLink+" to the installed k3sm")
	f.BoolVar(&mergeKC, "merge-kubeconfig", true, "merge the admin kubeconfig (context k3sm) into the invoking user's kubeconfig")
	f.StringVar(&kcPath, "kubeconfig", "", "kubeconfig to merge into (default ~/.kube/config of $SUDO_USER, or of root)")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the cluster to come up (0: do not wait)")
	f.BoolVar(&dryRun, "dry-run", false, "print the service files and commands instead of installing")
	f.StringVar(&dataVolume, "data-volume", "", "macOS: an APFS volume (name or device) that a root LaunchDaemon mounts at the data dir at boot")
	return cmd
}

func newUninstall() *cobra.Command {
	var purge bool
	var dataDir string
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Stop the k3sm service and its pods and remove what `k3sm install` made (--purge: the data dir too)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Geteuid() != 0 {
				return errors.New("k3sm uninstall removes the service and " + install.LibDir + ": run it as root (sudo k3sm uninstall)")
			}
			m, err := install.ReadManifest(install.ManifestPath)
			if err != nil {
				return err
			}
			if m != nil && cmd.Flags().Changed("data-dir") {
				if abs, _ := filepath.Abs(dataDir); abs != m.DataDir {
					return fmt.Errorf("--data-dir %s: k3sm is installed with --data-dir %s (uninstall takes the installed one; leave the flag out)", dataDir, m.DataDir)
				}
			}
			svc, err := install.Native()
			if err != nil {
				return err
			}
			o := install.Options{Out: cmd.OutOrStdout(), Runner: install.ExecRunner{}}
			return install.Uninstall(cmd.Context(), svc, o, install.UninstallOptions{Purge: purge, StopGrace: grace})
		},
	}
	dataDirFlag(cmd, &dataDir)
	cmd.Flags().BoolVar(&purge, "purge", false, "also remove the data dir (the cluster's state, certificates and pods' data)")
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "how long pods get after SIGTERM before SIGKILL")
	return cmd
}

// persistedFlags renders the server flags set in given (the install
// command's, which holds the server's), sorted by name, for the service.
func persistedFlags(given, server *pflag.FlagSet) []string {
	var args []string
	given.Visit(func(f *pflag.Flag) {
		// The endpoint may hold a password, and the token is one: they go
		// to the service's environment file (secretEnv), not its
		// world-readable unit.
		if f.Name == "data-dir" || f.Name == datastore.FlagEndpoint || f.Name == "token" || server.Lookup(f.Name) == nil {
			return
		}
		args = append(args, renderFlag(f)...)
	})
	return args
}

// renderFlag is f as given, in the form its flag set parses back.
func renderFlag(f *pflag.Flag) []string {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		var args []string
		for _, v := range sv.GetSlice() {
			args = append(args, "--"+f.Name+"="+v)
		}
		return args
	}
	if v := f.Value.String(); f.NoOptDefVal != "" && v == f.NoOptDefVal {
		return []string{"--" + f.Name}
	}
	return []string{"--" + f.Name + "=" + f.Value.String()}
}

// refuseAgentFlags: a server install given an agent's flag (--server,
// --token...) lacks --agent.
func refuseAgentFlags(given, server, agentFS *pflag.FlagSet) error {
	var errs []error
	given.Visit(func(f *pflag.Flag) {
		if server.Lookup(f.Name) == nil && agentFS.Lookup(f.Name) != nil {
			errs = append(errs, fmt.Errorf("--%s: a `k3sm agent` flag; add --agent to install an agent, or leave it out to install a server", f.Name))
		}
	})
	return errors.Join(errs...)
}

// installedAgent is what `k3sm install --agent` persists: the agent's
// flags for the unit, and the join token for its root-only environment.
type installedAgent struct {
	agent.Config
	args, env []string
}

// agentInstall checks the flags given to `install --agent` as `k3sm agent`
// parses them (naming a server flag it does not take) and renders them;
// install's own flags (neither the server's nor the agent's) are left out.
// The token (flag or $K3SM_TOKEN) goes to the environment, never the unit.
func agentInstall(given, server *pflag.FlagSet) (installedAgent, error) {
	a := installedAgent{Config: agentDefaults()}
	af := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	agentFlags(af, &a.Config)
	var errs []error
	given.Visit(func(f *pflag.Flag) {
		switch {
		case af.Lookup(f.Name) == nil && server.Lookup(f.Name) == nil: // install's own
		case af.Lookup(f.Name) == nil:
			errs = append(errs, fmt.Errorf("--%s: a `k3sm server` flag; `k3sm install --agent` takes `k3sm agent`'s flags (see k3sm agent --help)", f.Name))
		case f.Name == "netd-socket":
			errs = append(errs, errors.New("--netd-socket: k3sm install runs k3sm-netd as a unit of its own and points the agent at it; leave the flag out"))
		default:
			if err := af.Parse(renderFlag(f)); err != nil {
				errs = append(errs, err)
				return
			}
			if f.Name != "token" && f.Name != "data-dir" {
				a.args = append(a.args, renderFlag(f)...)
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return a, err
	}
	if a.Server == "" {
		a.Server = os.Getenv(AgentServerEnv)
		if a.Server != "" {
			a.args = append(a.args, "--server="+a.Server)
		}
	}
	if a.Token == "" {
		a.Token = os.Getenv(AgentTokenEnv)
	}
	if err := checkDisk(a.Disk); err != nil {
		return a, err
	}
	if err := a.Validate(); err != nil {
		return a, err
	}
	abs, err := filepath.Abs(a.DataDir)
	if err != nil {
		return a, fmt.Errorf("--data-dir %s: %w", a.DataDir, err)
	}
	a.DataDir = abs
	a.env = []string{AgentTokenEnv + "=" + a.Token}
	return a, nil
}

// secretEnv is the server's environment that install keeps out of the
// unit: the datastore endpoint (given by flag or by
// $K3SM_DATASTORE_ENDPOINT) and a joining server's token.
func secretEnv(cfg controlplane.Config) []string {
	var env []string
	if cfg.Datastore.Endpoint != "" {
		env = append(env, DatastoreEndpointEnv+"="+cfg.Datastore.Endpoint)
	}
	if cfg.Token != "" {
		env = append(env, AgentTokenEnv+"="+cfg.Token)
	}
	return env
}

// invokingUser is the user behind sudo, or the current one.
func invokingUser() (*user.User, error) {
	if name := os.Getenv("SUDO_USER"); name != "" {
		u, err := user.Lookup(name)
		if err != nil {
			return nil, fmt.Errorf("$SUDO_USER %q: %w (pass --kubeconfig, or --merge-kubeconfig=false)", name, err)
		}
		return u, nil
	}
	return user.Current()
}

func printPlan(cmd *cobra.Command, svc install.Service, o install.Options) error {
	units, err := svc.Units(o)
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	for _, u := range units {
		if u.Mode&0o077 == 0 {
			// Only root reads it: it holds secrets (install.Options.Environment).
			fmt.Fprintf(w, "# %s (mode %04o, %d bytes: not shown, it holds secrets)\n", u.Path, u.Mode, len(u.Content))
			continue
		}
		fmt.Fprintf(w, "# %s\n%s\n", u.Path, u.Content)
	}
	fmt.Fprintf(w, "# commands\n%s", install.RenderCommands(append(svc.Setup(o), svc.Start(o, true)...)))
	return nil
}
