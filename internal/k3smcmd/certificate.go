package k3smcmd

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/certs"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/spf13/cobra"
)

func newCertificate() *cobra.Command {
	var dataDir, output string
	cmd := &cobra.Command{
		Use:     "certificate",
		Aliases: []string{"cert"},
		Short:   "List the cluster's certificates and their expiry, re-issue leaf certificates",
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", controlplane.DefaultDataDir(), "the server's data directory ($K3SM_DATA_DIR)")
	check := &cobra.Command{
		Use:   "check",
		Short: "List every CA and leaf certificate with its expiry date",
		Long: "Status: ok; renew (a leaf within 90 days of expiry: the server re-issues it when it next starts);\n" +
			"rotate-ca (a CA within a year of expiry: see docs/operations.md, \"Rotating the CAs\"); expired.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			list, err := certs.Check(dataDir, time.Now())
			if err != nil {
				return err
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tKIND\tSERVICE\tSUBJECT\tEXPIRES\tDAYS\tSTATUS")
			for _, c := range list {
				kind, svc := "leaf", c.Service
				if c.CA {
					kind = "CA"
				}
				if svc == "" {
					svc = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", c.Name, kind, svc, c.Subject, c.NotAfter.UTC().Format("2006-01-02"), c.DaysLeft, c.Status)
			}
			return tw.Flush()
		},
	}
	outputFlag(check, &output)
	var services []string
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Re-issue leaf certificates (the server must be stopped)",
		Long: "Re-issues the leaf certificates of the named services (every leaf without --service) with new keys, the\n" +
			"same names and a full year, and updates the kubeconfigs under the data dir that embed them. The server\n" +
			"must be stopped: its components read their certificates when they start, so the new ones take effect\n" +
			"at the next `k3sm server`. Copies of admin.kubeconfig elsewhere (k3sm kubeconfig --merge) keep working\n" +
			"until the old certificate expires; merge again to update them. The CAs are not rotated: see\n" +
			"docs/operations.md, \"Rotating the CAs\".",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := certs.Check(dataDir, time.Now()); err != nil {
				return err
			}
			for _, s := range services {
				if _, ok := certs.Services[s]; !ok {
					return fmt.Errorf("--service %q: not a service; use one of %s (repeatable), or none for every leaf", s, strings.Join(certs.ServiceNames(), ", "))
				}
			}
			release, err := controlplane.LockDataDir(dataDir)
			if err != nil {
				return fmt.Errorf("%v (%s): stop it, run `k3sm certificate rotate` again, then start it; its components read their certificates when they start", err, dataDir)
			}
			defer release()
			done, kubeconfigs, err := certs.Rotate(dataDir, services)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, r := range done {
				fmt.Fprintf(out, "re-issued %s: expires %s (was %s)\n", r.Name, r.NotAfter.UTC().Format(time.DateTime), r.OldNotAfter.UTC().Format(time.DateTime))
			}
			if len(kubeconfigs) > 0 {
				fmt.Fprintf(out, "updated %s\n", strings.Join(kubeconfigs, ", "))
			}
			fmt.Fprintf(out, "start the server to use them: k3sm server --data-dir %s\n", dataDir)
			return nil
		},
	}
	rotate.Flags().StringSliceVar(&services, "service", nil, "service whose leaves to re-issue: "+strings.Join(certs.ServiceNames(), ", ")+" (repeatable; default every leaf)")
	cmd.AddCommand(check, rotate)
	return cmd
}
