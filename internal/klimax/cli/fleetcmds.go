package cli

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/fleet"
	"github.com/k3sm-dev/k3sm/internal/klimax/ui"
)

func fleetCmd(app *App) *cobra.Command {
	c := &cobra.Command{Use: "fleet", Aliases: []string{"fleets"}, Short: "Manage groups of clusters described by a Fleet manifest"}
	c.AddCommand(fleetCreateCmd(app, "create", "Create the clusters of a Fleet manifest (additive)"),
		fleetListCmd(app), fleetDescribeCmd(app), fleetLabelCmd(app), fleetDeleteCmd(app), fleetAdoptCmd(app))
	return c
}

func fleetCreateCmd(app *App, use, short string) *cobra.Command {
	var file string
	var dryRun, adopt bool
	var maxParallel int
	c := &cobra.Command{
		Use:   use + " -f fleet.yaml",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("-f <fleet.yaml> is required")
			}
			if maxParallel < 0 {
				return errors.New("--max-parallel must be >= 1")
			}
			f, err := fleet.Load(file)
			if err != nil {
				return err
			}
			cfg, err := app.Config()
			if err != nil {
				return err
			}
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			existing, err := m.List(cmd.Context(), "")
			if err != nil {
				return err
			}
			plan, err := fleet.PlanCreate(f, cfg, existing, adopt, maxParallel)
			if err != nil {
				return err
			}
			plan.Print(app.Out)
			if dryRun {
				fmt.Fprintln(app.Out, "dry run: nothing changed")
				return nil
			}
			res := fleet.ExecuteCreate(cmd.Context(), plan, m)
			if err := res.Err(); err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "fleet %s ready\n", f.Metadata.Name)
			return nil
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "Fleet manifest (apiVersion klimax.dev/v1alpha1)")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "print the plan (actions, slots, ports, subnets) and stop")
	c.Flags().IntVar(&maxParallel, "max-parallel", 0, "clusters created at once (default spec.maxParallel, else 1)")
	c.Flags().BoolVar(&adopt, "adopt", false, "add existing non-member clusters named in the manifest to the fleet")
	return c
}

type fleetSummary struct {
	Name     string   `json:"name"`
	Clusters []string `json:"clusters"`
}

func fleets(infos []cluster.Info) []fleetSummary {
	by := map[string][]string{}
	for _, in := range infos {
		if in.Fleet != "" {
			by[in.Fleet] = append(by[in.Fleet], in.Name)
		}
	}
	var out []fleetSummary
	for n, cs := range by {
		sort.Strings(cs)
		out = append(out, fleetSummary{Name: n, Clusters: cs})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func fleetListCmd(app *App) *cobra.Command {
	var format string
	c := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List fleets (clusters grouped by the klimax.dev/fleet label)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			infos, err := m.List(cmd.Context(), "")
			if err != nil {
				return err
			}
			fs := fleets(infos)
			if fs == nil {
				fs = []fleetSummary{}
			}
			return output(app.Out, format, fs, func() {
				if len(fs) == 0 {
					fmt.Fprintln(app.Out, "no fleets")
					return
				}
				w := tabwriter.NewWriter(app.Out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "FLEET\tCLUSTERS\tMEMBERS")
				for _, f := range fs {
					fmt.Fprintf(w, "%s\t%d\t%s\n", f.Name, len(f.Clusters), strings.Join(f.Clusters, ","))
				}
				w.Flush()
			})
		},
	}
	c.Flags().StringVarP(&format, "output", "o", "text", "output format: text, json or yaml")
	return c
}

func fleetMembers(app *App, cmd *cobra.Command, name string) ([]cluster.Info, error) {
	m, err := app.Clusters()
	if err != nil {
		return nil, err
	}
	return m.List(cmd.Context(), cluster.LabelFleet+"="+name)
}

func fleetDescribeCmd(app *App) *cobra.Command {
	var format string
	c := &cobra.Command{
		Use:   "describe <fleet>",
		Short: "Show a fleet's member clusters with slots, dependencies and labels",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			members, err := fleetMembers(app, cmd, args[0])
			if err != nil {
				return err
			}
			if len(members) == 0 {
				return fmt.Errorf("fleet %q has no member clusters (see klimax fleet list)", args[0])
			}
			return output(app.Out, format, members, func() {
				fmt.Fprintf(app.Out, "Fleet %s: %d clusters\n", args[0], len(members))
				w := tabwriter.NewWriter(app.Out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NAME\tSLOT\tSERVER\tDEPENDS ON\tREGION\tZONE\tLABELS")
				for _, in := range members {
					var ls []string
					for k, v := range in.Labels {
						if !cluster.Reserved(k) && k != cluster.LabelIngress && k != cluster.LabelRegion && k != cluster.LabelZone && !strings.HasPrefix(k, "kubernetes.io/") && !strings.HasPrefix(k, "node-role.") && !strings.HasPrefix(k, "beta.kubernetes.io/") && !strings.HasPrefix(k, "node.kubernetes.io/") {
							ls = append(ls, k+"="+v)
						}
					}
					sort.Strings(ls)
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", in.Name, in.Slot, dash(in.Server), dash(strings.Join(in.DependsOn, ",")), dash(in.Region), dash(in.Zone), dash(strings.Join(ls, ",")))
				}
				w.Flush()
			})
		},
	}
	c.Flags().StringVarP(&format, "output", "o", "text", "output format: text, json or yaml")
	return c
}

func fleetLabelCmd(app *App) *cobra.Command {
	var labels []string
	c := &cobra.Command{
		Use:   "label <fleet> -l key=value | -l key-",
		Short: "Set or remove labels on every member cluster",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, rm, err := cluster.ParseLabels(labels)
			if err != nil {
				return err
			}
			members, err := fleetMembers(app, cmd, args[0])
			if err != nil {
				return err
			}
			if len(members) == 0 {
				return fmt.Errorf("fleet %q has no member clusters", args[0])
			}
			m, _ := app.Clusters()
			var errs []error
			for _, in := range members {
				if err := m.Label(cmd.Context(), in.Name, set, rm, false); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", in.Name, err))
				}
			}
			if err := errors.Join(errs...); err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "labelled %d clusters of fleet %s\n", len(members), args[0])
			return nil
		},
	}
	c.Flags().StringArrayVarP(&labels, "label", "l", nil, "key=value to set, key- to remove (repeatable)")
	return c
}

func fleetDeleteCmd(app *App) *cobra.Command {
	var file string
	var yes bool
	c := &cobra.Command{
		Use:   "delete [fleet | -f fleet.yaml]",
		Short: "Delete a fleet's member clusters, dependents first",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			if (name == "") == (file == "") {
				return errors.New("give a fleet name or -f <fleet.yaml> (one of them)")
			}
			return fleetDeleteRun(app, cmd, name, file, yes)
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "Fleet manifest whose members to delete")
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return c
}

func fleetDeleteRun(app *App, cmd *cobra.Command, name, file string, yes bool) error {
	var f *fleet.Fleet
	if file != "" {
		var err error
		if f, err = fleet.Load(file); err != nil {
			return err
		}
		name = f.Metadata.Name
	}
	m, err := app.Clusters()
	if err != nil {
		return err
	}
	existing, err := m.List(cmd.Context(), "")
	if err != nil {
		return err
	}
	plan := fleet.PlanDelete(name, f, existing)
	plan.Print(app.Out)
	tasks := plan.Tasks(fleet.ActDelete)
	if len(tasks) == 0 {
		fmt.Fprintf(app.Out, "fleet %s: nothing to delete\n", name)
		return nil
	}
	if !yes {
		if !app.InTTY {
			return fmt.Errorf("this deletes %d clusters of fleet %s; pass --yes to confirm when not on a terminal", len(tasks), name)
		}
		ok, err := ui.Confirm(app.In, app.Err, fmt.Sprintf("Delete %d clusters of fleet %s?", len(tasks), name))
		if err != nil || !ok {
			return errors.New("not confirmed; nothing deleted")
		}
	}
	return fleet.ExecuteDelete(cmd.Context(), plan, m).Err()
}

func fleetAdoptCmd(app *App) *cobra.Command {
	return &cobra.Command{
		Use:   "adopt <fleet> <cluster...>",
		Short: "Make existing clusters members of a fleet",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if errs := validFleetName(args[0]); errs != nil {
				return errs
			}
			m, err := app.Clusters()
			if err != nil {
				return err
			}
			for _, n := range args[1:] {
				if err := cluster.ValidateName(n); err != nil {
					return err
				}
				if err := m.Label(cmd.Context(), n, map[string]string{cluster.LabelFleet: args[0]}, nil, true); err != nil {
					return fmt.Errorf("adopt %s: %w", n, err)
				}
				fmt.Fprintf(app.Out, "cluster %s is now in fleet %s\n", n, args[0])
			}
			return nil
		},
	}
}

func validFleetName(n string) error {
	if err := cluster.ValidateName(n); err != nil {
		return fmt.Errorf("invalid fleet name %q: use lower-case letters, digits and '-'", n)
	}
	return nil
}
