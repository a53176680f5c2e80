package k3smcmd

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/snapshot"
	"github.com/k3sm-dev/k3sm/internal/units"
	"github.com/spf13/cobra"
)

func newSnapshot() *cobra.Command {
	var dataDir, dir string
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Save, list and restore snapshots of the cluster (datastore and credentials)",
	}
	cmd.PersistentFlags().StringVar(&dir, "dir", "", "snapshot directory (default <data-dir>/server/snapshots)")
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", controlplane.DefaultDataDir(), "the server's data directory ($K3SM_DATA_DIR)")
	resolve := func() string {
		if dir == "" {
			dir = datadir.New(dataDir).SnapshotsDir()
		}
		return dir
	}

	var name string
	var keep int
	save := &cobra.Command{
		Use:   "save",
		Short: "Save a snapshot (the server may be running)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d := resolve()
			m, pruned, err := snapshot.Save(cmd.Context(), snapshot.SaveOptions{DataDir: dataDir, Dir: d, Prefix: name, Keep: keep})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "saved snapshot %s in %s (datastore %s, %d files)\n", m.Name, d, units.Bytes(m.DBBytes), len(m.Files))
			if len(pruned) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "removed the oldest %s-* snapshots (--keep %d): %s\n", name, keep, strings.Join(pruned, ", "))
			}
			return nil
		},
	}
	save.Flags().StringVar(&name, "name", snapshot.DefaultPrefix, "name prefix; the snapshot is <name>-<yyyymmdd-hhmmss> (UTC)")
	save.Flags().IntVar(&keep, "keep", snapshot.DefaultKeep, "snapshots with this --name kept, the new one included (0: all)")

	var output string
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List snapshots, oldest first",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			d := resolve()
			if err := snapshot.CheckCluster(dataDir); err != nil && dirFlagUnset(cmd) {
				return err
			}
			list, err := snapshot.List(d)
			if err != nil {
				return err
			}
			if output == "json" {
				if list == nil {
					list = []snapshot.Metadata{}
				}
				return writeJSON(cmd.OutOrStdout(), list)
			}
			if len(list) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "no snapshots in %s (take one with `k3sm snapshot save`)\n", d)
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tCREATED\tSIZE\tK3SM\tSERVER CA")
			for _, m := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, m.Created.Format("2006-01-02 15:04:05Z"), units.Bytes(m.DBBytes), m.K3smVersion, short(m.ServerCAFingerprint))
			}
			return tw.Flush()
		},
	}
	outputFlag(ls, &output)

	var force bool
	restore := &cobra.Command{
		Use:   "restore NAME",
		Short: "Restore a snapshot (the server must be stopped)",
		Long: "Replaces the datastore and the credentials of the data dir with the snapshot's. The server must be stopped;\n" +
			"the state it replaces is saved first as a pre-restore-<time> snapshot. A snapshot of another cluster\n" +
			"(another server CA) is refused unless --force.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d := resolve()
			res, err := snapshot.Restore(cmd.Context(), snapshot.RestoreOptions{DataDir: dataDir, Dir: d, Name: args[0], Force: force})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "restored snapshot %s (taken %s) into %s\n", res.Snapshot.Name, res.Snapshot.Created.Format("2006-01-02 15:04:05Z"), dataDir)
			if res.PreRestore != "" {
				fmt.Fprintf(out, "the state it replaced is snapshot %s in %s\n", res.PreRestore, datadir.New(dataDir).SnapshotsDir())
			}
			fmt.Fprintf(out, "start the server: k3sm server --data-dir %s\n", dataDir)
			return nil
		},
	}
	restore.Flags().BoolVar(&force, "force", false, "restore a snapshot of another cluster over this one")

	del := &cobra.Command{
		Use:     "delete NAME...",
		Aliases: []string{"rm"},
		Short:   "Delete snapshots",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d := resolve()
			for _, n := range args {
				if err := snapshot.Delete(d, n); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deleted snapshot %s\n", n)
			}
			return nil
		},
	}
	cmd.AddCommand(save, ls, restore, del)
	return cmd
}

func dirFlagUnset(cmd *cobra.Command) bool {
	f := cmd.Flags().Lookup("dir")
	return f == nil || !f.Changed
}

func short(fp string) string {
	if len(fp) > 7+16 {
		return fp[:7+16]
	}
	return fp
}
