package k3smcmd

import (
	"encoding/pem"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/server/join"
	"github.com/k3sm-dev/k3sm/internal/server/snapshot"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// newToken is `k3sm token`: the join tokens agents enroll with.
func newToken() *cobra.Command {
	var dataDir, output, description string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Join tokens for `k3sm agent`: create, list, delete",
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", controlplane.DefaultDataDir(), "the server's data directory ($K3SM_DATA_DIR)")
	admin := func() (kubernetes.Interface, error) {
		// Tokens live in the cluster, whichever datastore holds it.
		if _, ok, err := datastore.Recorded(datadir.New(dataDir)); err != nil {
			return nil, err
		} else if !ok {
			return nil, fmt.Errorf("%w at %s: start `k3sm server --data-dir %s` first, or pass the data dir of an existing cluster with --data-dir or $K3SM_DATA_DIR",
				snapshot.ErrNoCluster, dataDir, dataDir)
		}
		if running, _ := serverRunning(dataDir); !running {
			return nil, fmt.Errorf("no k3sm server is running on %s: tokens are kept in the cluster; start `k3sm server --data-dir %s` first", dataDir, dataDir)
		}
		rc, err := clientcmd.BuildConfigFromFlags("", datadir.New(dataDir).AdminKubeconfig())
		if err != nil {
			return nil, fmt.Errorf("admin kubeconfig: %w", err)
		}
		rc.UserAgent = "k3sm-token"
		return kubernetes.NewForConfig(rc)
	}
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a join token; its last line of output is the token to pass to `k3sm agent --token`",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cs, err := admin()
			if err != nil {
				return err
			}
			caFile, err := os.ReadFile(datadir.New(dataDir).TLS("server-ca.crt"))
			if err != nil {
				return fmt.Errorf("the cluster CA: %w", err)
			}
			// Pinned as the join endpoint serves it: the certificate alone.
			b, _ := pem.Decode(caFile)
			if b == nil || b.Type != "CERTIFICATE" {
				return fmt.Errorf("the cluster CA %s is not a PEM certificate", datadir.New(dataDir).TLS("server-ca.crt"))
			}
			caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b.Bytes})
			tok, err := join.CreateToken(cmd.Context(), cs, caPEM, ttl, description, time.Now())
			if err != nil {
				return err
			}
			if ttl > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "token %s expires at %s (k3sm token delete %s revokes it sooner)\n", tok.ID, time.Now().Add(ttl).UTC().Format(time.RFC3339), tok.ID)
			} else {
				fmt.Fprintf(cmd.ErrOrStderr(), "token %s never expires (k3sm token delete %s revokes it)\n", tok.ID, tok.ID)
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok.String())
			return nil
		},
	}
	create.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token is valid (0: no expiry)")
	create.Flags().StringVar(&description, "description", "", "what the token is for, shown by `k3sm token list`")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the join tokens (ids, never secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cs, err := admin()
			if err != nil {
				return err
			}
			tokens, err := join.ListTokens(cmd.Context(), cs)
			if err != nil {
				return err
			}
			if output == "json" {
				if tokens == nil {
					tokens = []join.TokenInfo{}
				}
				return writeJSON(cmd.OutOrStdout(), tokens)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tEXPIRES\tDESCRIPTION")
			for _, t := range tokens {
				exp := "never"
				if !t.Expires.IsZero() {
					exp = t.Expires.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", t.ID, exp, t.Description)
			}
			return w.Flush()
		},
	}
	outputFlag(list, &output)
	del := &cobra.Command{
		Use:   "delete ID...",
		Short: "Delete join tokens (by id, or the whole token): agents that joined stay joined",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cs, err := admin()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := join.DeleteToken(cmd.Context(), cs, id); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(create, list, del)
	return cmd
}
