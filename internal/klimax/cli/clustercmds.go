package cli

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/slot"
	"github.com/k3sm-dev/k3sm/internal/klimax/ui"
)

func clusterCmd(app *App) *cobra.Command {
	c := &cobra.Command{Use: "cluster", Aliases: []string{"clusters"}, Short: "Create, delete, list and label kind clusters"}
	c.AddCommand(clusterCreateCmd(app), clusterDeleteCmd(app), clusterListCmd(app), clusterLabelCmd(app),
		clusterStopCmd(app), clusterStartCmd(app), clusterLoadCmd(app), clusterLogsCmd(app),
		fleetCreateCmd(app, "apply", "Create the clusters of a Fleet manifest (same as fleet create)"), e2eCmd(app))
	return c
}

// completeClusters offers existing cluster names for completion.
func completeClusters(app *App) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		m, err := app.Clusters()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ex, err := m.Existing(cmd.Context())
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var names []string
		for n := range ex {
			names = append(names, n)
		}
		sort.Strings(names)
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

func clusterCreateCmd(app *App) *cobra.Command {
	var region, zone, nodeVersion string
	var labels []string
	var num, workers int
	var wait time.Duration
	c := &cobra.Command{
		Use:   "create <name>",
		Short: "Create a kind cluster in the next free slot",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cluster.ValidateName(args[0]); err != nil {
				return err
			}
			set, rm, err := cluster.ParseLabels(labels)
			if err != nil {
				return err
			}
			if len(rm) > 0 {
				return fmt.Errorf("-l %s-: removing labels makes no sense on create", rm[0])
			}
			// kind hands these to the kubelet as --node-labels: check them
			// as the kubelet will, naming the flag, before anything runs.
			if err := cluster.ValidateNodeLabels("-l", set); err != nil {
				return err
			}
			if region != "" {
				if err := cluster.ValidateNodeLabel("--region", cluster.LabelRegion, region); err != nil {
					return err
				}
			}
			if zone != "" {
				if err := cluster.ValidateNodeLabel("--zone", cluster.LabelZone, zone); err != nil {
					return err
				}
			}
			if err := cluster.ValidateWorkers("--workers", workers); err != nil {
				return err
			}
			if wait < 0 {
				return fmt.Errorf("--wait %s is negative (fix: use e.g. --wait 5m)", wait)
			}
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			info, err := m.Create(cmd.Context(), cluster.CreateOptions{Name: args[0], Region: region, Zone: zone,
				Labels: set, NodeVersion: nodeVersion, Slot: slotOf(num), Workers: workers, Wait: wait})
			if err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "cluster %s ready: slot %d, API %s, kubeconfig %s\n", info.Name, info.Slot, info.Server, info.Kubeconfig)
			return nil
		},
	}
	c.Flags().StringVar(&region, "region", "", "topology.kubernetes.io/region label")
	c.Flags().StringVar(&zone, "zone", "", "topology.kubernetes.io/zone label")
	c.Flags().StringArrayVarP(&labels, "label", "l", nil, "node label key=value (repeatable)")
	c.Flags().StringVar(&nodeVersion, "node-version", "", "kindest/node tag (default kind.nodeVersion from the config)")
	c.Flags().IntVar(&num, "num", 0, "pin the slot number 1-99 (default: lowest free)")
	c.Flags().IntVar(&workers, "workers", 0, fmt.Sprintf("worker nodes besides the control plane (0-%d)", cluster.MaxWorkers))
	c.Flags().DurationVar(&wait, "wait", 0, "wait up to this long until every node and kube-system pod is Ready (e.g. 5m; default: do not wait)")
	return c
}

func clusterStopCmd(app *App) *cobra.Command {
	return &cobra.Command{
		Use:               "stop <name>",
		Short:             "Stop the cluster's node containers (slot, files and state are kept; start it again with cluster start)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeClusters(app),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			stopped, err := m.Stop(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if len(stopped) == 0 {
				fmt.Fprintf(app.Out, "cluster %s was already stopped\n", args[0])
				return nil
			}
			fmt.Fprintf(app.Out, "cluster %s stopped (%s); start it with: klimax cluster start %s\n", args[0], strings.Join(stopped, ", "), args[0])
			return nil
		},
	}
}

func clusterStartCmd(app *App) *cobra.Command {
	var wait time.Duration
	c := &cobra.Command{
		Use:               "start <name>",
		Short:             "Start a stopped cluster's node containers and wait for its API, nodes and system pods",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeClusters(app),
		RunE: func(cmd *cobra.Command, args []string) error {
			if wait <= 0 {
				return fmt.Errorf("--wait %s: use a positive duration, e.g. --wait 3m", wait)
			}
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			if err := m.Start(cmd.Context(), args[0], wait); err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "cluster %s is running\n", args[0])
			return nil
		},
	}
	c.Flags().DurationVar(&wait, "wait", cluster.DefaultStartWait, "how long to wait for the API, nodes and kube-system pods")
	return c
}

func clusterLoadCmd(app *App) *cobra.Command {
	return &cobra.Command{
		Use:               "load <name> <image>...",
		Short:             "Load images from the machine's Docker engine into every node (kind load docker-image)",
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: completeClusters(app),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			if err := m.Load(cmd.Context(), args[0], args[1:]); err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "loaded %s into cluster %s\n", strings.Join(args[1:], ", "), args[0])
			return nil
		},
	}
}

func clusterLogsCmd(app *App) *cobra.Command {
	return &cobra.Command{
		Use:               "logs <name> [dir]",
		Short:             "Export node and component logs for a bug report (kind export logs; default dir ./klimax-logs-<name>-<time>)",
		Args:              cobra.RangeArgs(1, 2),
		ValidArgsFunction: completeClusters(app),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := ""
			if len(args) == 2 {
				dir = args[1]
			}
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			out, err := m.Logs(cmd.Context(), args[0], dir)
			if err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "logs of cluster %s written to %s\n", args[0], out)
			return nil
		},
	}
}

func clusterDeleteCmd(app *App) *cobra.Command {
	var file, selector string
	var yes bool
	c := &cobra.Command{
		Use:               "delete [name...]",
		Short:             "Delete clusters by name, by -l selector, by Fleet file, or pick them interactively",
		ValidArgsFunction: completeClusters(app),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, a := range args {
				if err := cluster.ValidateName(a); err != nil {
					return err
				}
			}
			if file != "" {
				if len(args) > 0 || selector != "" {
					return errors.New("use either names, -l or -f, not several")
				}
				return fleetDeleteRun(app, cmd, "", file, yes)
			}
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			names := args
			switch {
			case selector != "":
				if len(args) > 0 {
					return errors.New("use either names or -l, not both")
				}
				infos, err := m.List(cmd.Context(), selector)
				if err != nil {
					return err
				}
				for _, in := range infos {
					names = append(names, in.Name)
				}
				if len(names) == 0 {
					fmt.Fprintf(app.Out, "no clusters match %q\n", selector)
					return nil
				}
			case len(args) == 0:
				if !app.InTTY {
					return errors.New("no cluster named: pass names, -l <selector> or -f <fleet.yaml> (the interactive picker needs a terminal)")
				}
				ex, err := m.Existing(cmd.Context())
				if err != nil {
					return err
				}
				var all []string
				for n := range ex {
					all = append(all, n)
				}
				if len(all) == 0 {
					fmt.Fprintln(app.Out, "no clusters")
					return nil
				}
				sort.Strings(all)
				names, err = ui.RunPicker(ui.NewPicker("Delete which clusters?", all), app.In, app.Err)
				if err != nil {
					return err
				}
				if len(names) == 0 {
					fmt.Fprintln(app.Out, "nothing selected")
					return nil
				}
				yes = yes || len(names) > 0 // choosing in the picker is the confirmation
			}
			if !yes && (selector != "" || len(names) > 1) {
				if !app.InTTY {
					return fmt.Errorf("this deletes %d clusters (%s); pass --yes to confirm when not on a terminal", len(names), strings.Join(names, ", "))
				}
				ok, err := ui.Confirm(app.In, app.Err, fmt.Sprintf("Delete %s?", strings.Join(names, ", ")))
				if err != nil || !ok {
					return errors.New("not confirmed; nothing deleted")
				}
			}
			var errs []error
			for _, n := range names {
				if err := m.Delete(cmd.Context(), n); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintf(app.Out, "deleted cluster %s\n", n)
			}
			return errors.Join(errs...)
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "delete the member clusters of this Fleet manifest")
	c.Flags().StringVarP(&selector, "selector", "l", "", "delete clusters matching this label selector")
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return c
}

func clusterListCmd(app *App) *cobra.Command {
	var format, selector string
	c := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List clusters with slot, API address, fleet and topology",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			infos, err := m.List(cmd.Context(), selector)
			if err != nil {
				return err
			}
			if infos == nil {
				infos = []cluster.Info{}
			}
			return output(app.Out, format, infos, func() { printClusters(app, infos) })
		},
	}
	c.Flags().StringVarP(&format, "output", "o", "text", "output format: text, json or yaml")
	c.Flags().StringVarP(&selector, "selector", "l", "", "label selector, e.g. env=dev,topology.kubernetes.io/region=eu")
	return c
}

func printClusters(app *App, infos []cluster.Info) {
	if len(infos) == 0 {
		fmt.Fprintln(app.Out, "no clusters (create one with: klimax cluster create <name>)")
		return
	}
	w := tabwriter.NewWriter(app.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tSLOT\tSTATE\tSERVER\tFLEET\tREGION\tZONE")
	for _, in := range infos {
		state := in.State
		if state == "running" && !in.Reachable {
			state = "unreachable"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", in.Name, in.Slot, state, dash(in.Server), dash(in.Fleet), dash(in.Region), dash(in.Zone))
	}
	w.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func clusterLabelCmd(app *App) *cobra.Command {
	var labels []string
	c := &cobra.Command{
		Use:               "label <name> -l key=value | -l key-",
		Short:             "Set or remove node labels of a cluster",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeClusters(app),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cluster.ValidateName(args[0]); err != nil {
				return err
			}
			set, rm, err := cluster.ParseLabels(labels)
			if err != nil {
				return err
			}
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			if err := m.Label(cmd.Context(), args[0], set, rm, false); err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "cluster %s labelled\n", args[0])
			return nil
		},
	}
	c.Flags().StringArrayVarP(&labels, "label", "l", nil, "key=value to set, key- to remove (repeatable)")
	return c
}

func e2eCmd(app *App) *cobra.Command {
	var cleanup bool
	c := &cobra.Command{
		Use:               "e2e-test-nginx <name>",
		Short:             "Deploy nginx behind a MetalLB LoadBalancer and fetch it from this host",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeClusters(app),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			ip, err := m.E2ENginx(cmd.Context(), args[0], cleanup, nil)
			if err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "PASS: nginx answered on http://%s/\n", ip)
			return nil
		},
	}
	c.Flags().BoolVar(&cleanup, "cleanup", false, "remove the test objects afterwards")
	return c
}

func slotOf(n int) slot.Slot { return slot.Slot(n) }
