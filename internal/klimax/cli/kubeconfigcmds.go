package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
)

func kubeconfigCmd(app *App) *cobra.Command {
	c := &cobra.Command{Use: "kubeconfig", Short: "Use, merge, export or remove a cluster's kubeconfig"}
	one := func(use, short string, run func(cmd *cobra.Command, name string) error) *cobra.Command {
		return &cobra.Command{
			Use: use + " <name>", Short: short, Args: cobra.ExactArgs(1), ValidArgsFunction: completeClusters(app),
			RunE: func(cmd *cobra.Command, args []string) error {
				if err := cluster.ValidateName(args[0]); err != nil {
					return err
				}
				return run(cmd, args[0])
			},
		}
	}
	// ensure returns the per-cluster file, re-fetching it when missing.
	ensure := func(cmd *cobra.Command, name string) (string, []byte, error) {
		path := app.clusterKubeconfig(name)
		if data, err := os.ReadFile(path); err == nil {
			return path, data, nil
		}
		m, err := app.Clusters()
		if err != nil {
			return "", nil, err
		}
		data, err := m.Kubeconfig(cmd.Context(), name)
		return path, data, err
	}
	c.AddCommand(
		one("path", "Print the cluster's kubeconfig file path", func(cmd *cobra.Command, name string) error {
			path, _, err := ensure(cmd, name)
			if err != nil {
				return err
			}
			fmt.Fprintln(app.Out, path)
			return nil
		}),
		one("env", "Print an export of KUBECONFIG for the cluster: eval $(klimax kubeconfig env <name>)", func(cmd *cobra.Command, name string) error {
			path, _, err := ensure(cmd, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "export KUBECONFIG=%s\n", shellQuote(path))
			return nil
		}),
		one("merge", "Merge the cluster's context into ~/.kube/config", func(cmd *cobra.Command, name string) error {
			_, data, err := ensure(cmd, name)
			if err != nil {
				return err
			}
			backup, err := kubeconfig.Merge(app.SharedKubeconfig(), data, kubeconfig.MergeOptions{})
			if err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "merged context %s into %s", cluster.ContextName(name), app.SharedKubeconfig())
			if backup != "" {
				fmt.Fprintf(app.Out, " (previous version: %s)", backup)
			}
			fmt.Fprintln(app.Out)
			return nil
		}),
		one("use", "Merge the cluster's context and make it current", func(cmd *cobra.Command, name string) error {
			_, data, err := ensure(cmd, name)
			if err != nil {
				return err
			}
			if _, err := kubeconfig.Merge(app.SharedKubeconfig(), data, kubeconfig.MergeOptions{SetCurrentContext: true}); err != nil {
				return err
			}
			if err := kubeconfig.UseContext(app.SharedKubeconfig(), cluster.ContextName(name)); err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "current context is now %s\n", cluster.ContextName(name))
			return nil
		}),
		one("remove", "Remove the cluster's context from ~/.kube/config (the cluster is kept)", func(cmd *cobra.Command, name string) error {
			if err := kubeconfig.Remove(app.SharedKubeconfig(), []string{cluster.ContextName(name)}); err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "removed context %s from %s\n", cluster.ContextName(name), app.SharedKubeconfig())
			return nil
		}),
	)
	return c
}

func (app *App) clusterKubeconfig(name string) string {
	return app.KubeDir() + string(os.PathSeparator) + name + ".kubeconfig"
}

// shellQuote single-quotes s for POSIX shells.
func shellQuote(s string) string {
	out := "'"
	for _, r := range s {
		if r == '\'' {
			out += `'\''`
		} else {
			out += string(r)
		}
	}
	return out + "'"
}
