package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/platform"
	"github.com/k3sm-dev/k3sm/internal/klimax/ui"
	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
)

func upCmd(app *App) *cobra.Command {
	c := &cobra.Command{
		Use:   "up",
		Short: "Create/start the VM and set up Docker, the kind network, mirrors and routing (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := app.Platform()
			if err != nil {
				return err
			}
			if err := p.Up(cmd.Context(), app.Progress().Step); err != nil {
				return err
			}
			if !p.Driver().NeedsRoute() {
				if err := app.restartDownedClusters(cmd); err != nil {
					return err
				}
			}
			fmt.Fprintln(app.Out, "klimax is up; create a cluster with: klimax cluster create <name>")
			return nil
		},
	}
	c.Flags().BoolVar(&app.ShowVMLogs, "show-vm-logs", false, "stream the VM's boot and provisioning logs")
	return c
}

func downCmd(app *App) *cobra.Command {
	var removeRoute bool
	c := &cobra.Command{
		Use:   "down",
		Short: "Stop the VM, or on a host klimax's clusters and mirrors (everything is kept; klimax up starts it again)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := app.Platform()
			if err != nil {
				return err
			}
			// A VM takes its clusters down with it. On a host nothing does:
			// stop klimax's clusters' node containers (never the user's
			// own kind clusters) and remember them for the next up.
			if !p.Driver().NeedsRoute() {
				if err := app.stopClustersForDown(cmd); err != nil {
					return err
				}
			}
			done := app.Progress().Step("stop")
			err = p.Down(cmd.Context(), removeRoute)
			done(err)
			return err
		},
	}
	c.Flags().BoolVar(&removeRoute, "remove-route", false, "also remove the host route to the kind network")
	return c
}

func destroyCmd(app *App) *cobra.Command {
	var yes bool
	c := &cobra.Command{
		Use:   "destroy",
		Short: "Delete the VM (or, on a host, everything klimax created) and every cluster's kubeconfig entries",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := app.Config()
			if err != nil {
				return err
			}
			if !yes {
				if !app.InTTY {
					return fmt.Errorf("destroy deletes VM %s and all its clusters; pass --yes to confirm when not on a terminal", cfg.VM.Name)
				}
				ok, err := ui.Confirm(app.In, app.Err, fmt.Sprintf("Delete VM %s and all its clusters?", cfg.VM.Name))
				if err != nil || !ok {
					return fmt.Errorf("not confirmed; nothing changed")
				}
			}
			p, err := app.Platform()
			if err != nil {
				return err
			}
			// The host driver has no VM to take the clusters with it: delete
			// klimax's first. Only klimax's: on a host the user's own kind
			// clusters (and their kind-<name> contexts) share the engine.
			if !p.Driver().NeedsRoute() {
				if m, err := app.Clusters(); err == nil {
					if existing, err := m.Existing(cmd.Context()); err == nil {
						var kept []string
						for name, n := range existing {
							if ours, err := m.Owned(cmd.Context(), n); !ours {
								kept = append(kept, name)
								if err != nil {
									fmt.Fprintln(app.Err, "warning: "+err.Error())
								}
								continue
							}
							if err := m.Delete(cmd.Context(), name); err != nil {
								return err
							}
						}
						if len(kept) > 0 {
							sort.Strings(kept)
							fmt.Fprintf(app.Out, "kept kind cluster(s) klimax did not create: %s\n", strings.Join(kept, ", "))
						}
					}
				}
			}
			done := app.Progress().Step("destroy " + cfg.VM.Name)
			err = p.Destroy(cmd.Context())
			done(err)
			if err != nil {
				return err
			}
			if err := os.Remove(app.downedFile()); err != nil && !os.IsNotExist(err) {
				return err
			}
			return app.forgetAllKubeconfigs()
		},
	}
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return c
}

// downedFile lists the clusters `down` stopped on a host, one per line, so
// `up` starts exactly those again (a cluster stopped with `cluster stop`
// stays stopped).
func (app *App) downedFile() string { return filepath.Join(app.klimaxHome(), "stopped-by-down") }

func (app *App) readDowned() []string {
	data, err := os.ReadFile(app.downedFile())
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && cluster.ValidateName(l) == nil {
			out = append(out, l)
		}
	}
	return out
}

func (app *App) stopClustersForDown(cmd *cobra.Command) error {
	m, err := app.Clusters()
	if err != nil {
		return err
	}
	existing, err := m.Existing(cmd.Context())
	if err != nil {
		return nil // no engine answers: nothing runs; the platform's down says so
	}
	downed := map[string]bool{}
	for _, n := range app.readDowned() {
		downed[n] = true
	}
	var names, kept []string
	for name, n := range existing {
		if ours, err := m.Owned(cmd.Context(), n); !ours {
			if n.State == "running" {
				kept = append(kept, name)
			}
			if err != nil {
				fmt.Fprintln(app.Err, "warning: "+err.Error())
			}
			continue
		}
		if n.State == "running" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var stopped []string
	var errs []error
	for _, name := range names {
		if _, err := m.Stop(cmd.Context(), name); err != nil {
			errs = append(errs, err)
			continue
		}
		downed[name] = true
		stopped = append(stopped, name)
	}
	if len(downed) > 0 {
		var all []string
		for n := range downed {
			all = append(all, n)
		}
		sort.Strings(all)
		if err := os.MkdirAll(app.klimaxHome(), 0o700); err != nil {
			return err
		}
		if err := atomicfile.WriteFile(app.downedFile(), []byte(strings.Join(all, "\n")+"\n"), 0o600); err != nil {
			return err
		}
	}
	if len(stopped) > 0 {
		fmt.Fprintf(app.Out, "stopped cluster(s) %s; klimax up starts them again\n", strings.Join(stopped, ", "))
	}
	if len(kept) > 0 {
		sort.Strings(kept)
		fmt.Fprintf(app.Out, "left running: kind cluster(s) klimax did not create: %s\n", strings.Join(kept, ", "))
	}
	return errors.Join(errs...)
}

// restartDownedClusters starts the clusters the last `down` stopped and
// waits for each; the record is removed once all of them run (or are gone).
func (app *App) restartDownedClusters(cmd *cobra.Command) error {
	names := app.readDowned()
	if len(names) == 0 {
		return nil
	}
	m, err := app.Clusters()
	if err != nil {
		return err
	}
	existing, err := m.Existing(cmd.Context())
	if err != nil {
		return err
	}
	var started []string
	var errs []error
	var left []string
	for _, name := range names {
		if _, ok := existing[name]; !ok {
			continue // deleted meanwhile
		}
		if err := m.Start(cmd.Context(), name, cluster.DefaultStartWait); err != nil {
			errs = append(errs, err)
			left = append(left, name)
			continue
		}
		started = append(started, name)
	}
	if len(left) == 0 {
		if err := os.Remove(app.downedFile()); err != nil && !os.IsNotExist(err) {
			return err
		}
	} else if err := atomicfile.WriteFile(app.downedFile(), []byte(strings.Join(left, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	if len(started) > 0 {
		fmt.Fprintf(app.Out, "started cluster(s) %s again\n", strings.Join(started, ", "))
	}
	return errors.Join(errs...)
}

// forgetAllKubeconfigs removes every per-cluster kubeconfig file and its
// merged context: the files under ~/.kube/klimax are the record of what
// klimax merged (the reference left contexts behind on destroy).
func (app *App) forgetAllKubeconfigs() error {
	files, _ := filepath.Glob(filepath.Join(app.KubeDir(), "*.kubeconfig"))
	var ctxs []string
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".kubeconfig")
		if cluster.ValidateName(name) == nil {
			ctxs = append(ctxs, cluster.ContextName(name))
		}
	}
	cfg, err := app.Config()
	if err != nil {
		return err
	}
	if len(ctxs) > 0 && cfg.Kind.AutoRemoveKubeconfig {
		if err := kubeconfig.Remove(app.SharedKubeconfig(), ctxs); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	if len(files) > 0 {
		fmt.Fprintf(app.Out, "removed %d cluster kubeconfig(s) from %s\n", len(files), app.KubeDir())
	}
	return nil
}

func statusCmd(app *App) *cobra.Command {
	var format string
	c := &cobra.Command{
		Use:   "status",
		Short: "Show the VM, Docker engine, network, mirrors, route and clusters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := app.Platform()
			if err != nil {
				return err
			}
			st, err := p.Status(cmd.Context())
			if err != nil {
				return err
			}
			type full struct {
				*platform.Status
				Clusters []cluster.Info `json:"clusters"`
			}
			// An empty list, not null, when there are none (or no engine).
			out := full{Status: st, Clusters: []cluster.Info{}}
			if st.Engine.Reachable {
				if m, err := app.Clusters(); err == nil {
					if l, _ := m.List(cmd.Context(), ""); l != nil {
						out.Clusters = l
					}
				}
			}
			return output(app.Out, format, out, func() {
				w := tabwriter.NewWriter(app.Out, 0, 4, 2, ' ', 0)
				fmt.Fprintf(w, "machine\t%s %s\t%s\n", st.Driver, st.Machine.Name, st.Machine.Phase)
				if st.Engine.Reachable {
					fmt.Fprintf(w, "docker\t%s\tversion %s\n", orDefault(st.DockerHost, "default"), st.Engine.Version)
				} else if st.Engine.Error != "" {
					fmt.Fprintf(w, "docker\tunreachable\t%s\n", st.Engine.Error)
				}
				if st.Network.Exists {
					fmt.Fprintf(w, "network %s\t%s\t%s\n", st.Network.Name, st.Network.Subnet, st.Network.Problem)
				}
				for _, m := range st.Mirrors {
					state := "missing"
					if m.Exists {
						state = m.Status
					}
					fmt.Fprintf(w, "mirror %s\t%s\t\n", m.Name, state)
				}
				if st.APIHost != "" {
					fmt.Fprintf(w, "API address\t%s\t\n", st.APIHost)
				}
				if st.Route != nil {
					fmt.Fprintf(w, "host route\tpresent=%v correct=%v\t%s\n", st.Route.Present, st.Route.Correct, st.Route.Gateway)
				}
				if st.Rules != nil {
					fmt.Fprintf(w, "no-SNAT rules\tok=%v\t%s\n", st.Rules.OK(), strings.Join(st.Rules.Problems, "; "))
				}
				fmt.Fprintf(w, "clusters\t%d\t\n", len(out.Clusters))
				w.Flush()
				for _, e := range st.Errors {
					fmt.Fprintln(app.Out, "error:", e)
				}
			})
		},
	}
	c.Flags().StringVarP(&format, "output", "o", "text", "output format: text, json or yaml")
	return c
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func doctorCmd(app *App) *cobra.Command {
	var format string
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Check everything klimax set up; prints PASS/WARN/FAIL with fixes and exits non-zero on FAIL",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "text" && format != "json" && format != "yaml" {
				return fmt.Errorf("unknown output format %q (use text, json or yaml)", format)
			}
			var checks []platform.Check
			cfg, err := app.Config()
			if err != nil {
				checks = append(checks, platform.Check{Name: "config", Status: platform.Fail, Detail: err.Error(), Fix: "run `klimax config edit`"})
			} else {
				checks = append(checks, platform.Check{Name: "config", Status: platform.Pass, Detail: app.configPath()})
				p, err := app.Platform()
				if err != nil {
					checks = append(checks, platform.Check{Name: "platform", Status: platform.Fail, Detail: err.Error(), Fix: "run `klimax config edit`"})
				} else {
					checks = append(checks, p.Doctor(cmd.Context())...)
					if !platform.Failed(checks) {
						checks = append(checks, app.clusterChecks(cmd, cfg.Kind.AutoMergeKubeconfig)...)
					}
				}
			}
			err = output(app.Out, format, checks, func() {
				w := tabwriter.NewWriter(app.Out, 0, 4, 2, ' ', 0)
				for _, c := range checks {
					fmt.Fprintf(w, "%s\t%s\t%s\n", c.Status, c.Name, c.Detail)
					if c.Fix != "" && c.Status != platform.Pass {
						fmt.Fprintf(w, "\t\tfix: %s\n", c.Fix)
					}
				}
				w.Flush()
			})
			if err != nil {
				return err
			}
			if platform.Failed(checks) {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	c.Flags().StringVarP(&format, "output", "o", "text", "output format: text, json or yaml")
	return c
}

// clusterChecks adds one check per cluster: reachable, kubeconfig present and merged.
func (app *App) clusterChecks(cmd *cobra.Command, merged bool) []platform.Check {
	m, err := app.Clusters()
	if err != nil {
		return []platform.Check{{Name: "clusters", Status: platform.Warn, Detail: err.Error()}}
	}
	infos, err := m.List(cmd.Context(), "")
	if err != nil {
		return []platform.Check{{Name: "clusters", Status: platform.Warn, Detail: err.Error(), Fix: "run `klimax up`"}}
	}
	shared, _ := os.ReadFile(app.SharedKubeconfig())
	var out []platform.Check
	for _, in := range infos {
		name := "cluster " + in.Name
		switch {
		case in.Slot == 0:
			out = append(out, platform.Check{Name: name, Status: platform.Warn, Detail: fmt.Sprintf("API port %d is not a klimax slot port (created outside klimax?)", in.APIPort)})
		case !in.Reachable:
			out = append(out, platform.Check{Name: name, Status: platform.Warn, Detail: in.Error, Fix: "run `klimax up`; if it persists, `klimax cluster delete " + in.Name + "` and create it again"})
		case merged && !strings.Contains(string(shared), "name: "+cluster.ContextName(in.Name)+"\n"):
			out = append(out, platform.Check{Name: name, Status: platform.Warn, Detail: "context " + cluster.ContextName(in.Name) + " missing from " + app.SharedKubeconfig(), Fix: "run `klimax kubeconfig merge " + in.Name + "`"})
		default:
			out = append(out, platform.Check{Name: name, Status: platform.Pass, Detail: fmt.Sprintf("slot %d, %s", in.Slot, in.Server)})
		}
	}
	return out
}

func shellCmd(app *App) *cobra.Command {
	return &cobra.Command{
		Use:   "shell [-- command args...]",
		Short: "Open a shell in the VM (or run a command there)",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := app.Platform()
			if err != nil {
				return err
			}
			err = p.Shell(cmd.Context(), args)
			// The command's own exit status is klimax's, as with ssh; the
			// command already said what went wrong.
			var xe *exec.ExitError
			if errors.As(err, &xe) && xe.ExitCode() > 0 {
				return &ExitError{Code: xe.ExitCode()}
			}
			return err
		},
	}
}

func dockerEnvCmd(app *App) *cobra.Command {
	var unset bool
	c := &cobra.Command{
		Use:   "docker-env",
		Short: "Print shell exports pointing docker at klimax's engine: eval $(klimax docker-env)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := app.Platform()
			if err != nil {
				return err
			}
			fmt.Fprint(app.Out, p.DockerEnv(unset))
			return nil
		},
	}
	c.Flags().BoolVar(&unset, "unset", false, "print the commands that undo docker-env")
	return c
}

func dockerContextCmd(app *App) *cobra.Command {
	var unset bool
	c := &cobra.Command{
		Use:   "docker-context",
		Short: "Create and switch to a Docker CLI context for klimax's engine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := app.Platform()
			if err != nil {
				return err
			}
			msg, err := p.DockerContext(cmd.Context(), unset)
			if err != nil {
				return err
			}
			fmt.Fprintln(app.Out, msg)
			return nil
		},
	}
	c.Flags().BoolVar(&unset, "unset", false, "switch back to the default context and remove klimax's")
	return c
}
