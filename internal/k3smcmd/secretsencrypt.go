package k3smcmd

import (
	"fmt"
	"sort"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/encryption"
	"github.com/k3sm-dev/k3sm/internal/server/snapshot"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func newSecretsEncrypt() *cobra.Command {
	var dataDir, output string
	cmd := &cobra.Command{
		Use:   "secrets-encrypt",
		Short: "Secrets encryption at rest: status and key rotation",
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", controlplane.DefaultDataDir(), "the server's data directory ($K3SM_DATA_DIR)")
	resolve := func() error { return snapshot.CheckCluster(dataDir) }
	status := &cobra.Command{
		Use:   "status",
		Short: "Say whether Secrets are encrypted, with which key, and how many Secrets each key holds",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if err := resolve(); err != nil {
				return err
			}
			st, err := encryption.GetStatus(cmd.Context(), dataDir)
			if err != nil {
				return err
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			out := cmd.OutOrStdout()
			if !st.Enabled {
				fmt.Fprintf(out, "Encryption: off (Secrets are stored in plaintext; it can be turned on only when a cluster is created: `k3sm server --secrets-encryption` on a new --data-dir)\n")
			} else {
				fmt.Fprintf(out, "Encryption: on\nProvider: %s\nActive key: %s\nKeys: %s\nConfig: %s\n", st.Provider, st.ActiveKey, strings.Join(st.Keys, ", "), st.Config)
			}
			var keys []string
			for k := range st.Secrets {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			var parts []string
			for _, k := range keys {
				parts = append(parts, fmt.Sprintf("%s: %d", k, st.Secrets[k]))
			}
			if len(parts) == 0 {
				parts = []string{"none"}
			}
			fmt.Fprintf(out, "Secrets in the datastore by key: %s\n", strings.Join(parts, ", "))
			return nil
		},
	}
	outputFlag(status, &output)
	rotate := &cobra.Command{
		Use:   "rotate-keys",
		Short: "Encrypt every Secret with a new key and drop the old one, while the server runs",
		Long: "Adds a new key as the encrypting one (the old one still decrypts), waits for the apiserver to load it\n" +
			"(it re-reads its configuration every minute), rewrites every Secret, checks in the datastore that none\n" +
			"is left under the old key, then drops the old key. The server keeps serving throughout. Take a snapshot\n" +
			"afterwards: older snapshots carry the old key.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if err := resolve(); err != nil {
				return err
			}
			l := datadir.New(dataDir)
			if st, err := encryption.GetStatus(cmd.Context(), dataDir); err != nil {
				return err
			} else if !st.Enabled {
				return fmt.Errorf("secrets encryption is off on the cluster at %s (no %s): it is turned on when a cluster is created, with `k3sm server --secrets-encryption` on a new --data-dir",
					dataDir, l.EncryptionConfig())
			}
			if running, _ := serverRunning(dataDir); !running {
				return fmt.Errorf("no k3sm server is running on %s: rotate-keys works through the running apiserver; start `k3sm server --data-dir %s` first", dataDir, dataDir)
			}
			rc, err := clientcmd.BuildConfigFromFlags("", l.AdminKubeconfig())
			if err != nil {
				return fmt.Errorf("admin kubeconfig: %w", err)
			}
			rc.QPS, rc.Burst = 50, 100
			rc.UserAgent = "k3sm-secrets-encrypt"
			client, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return err
			}
			progress := func(line string) { fmt.Fprintln(cmd.ErrOrStderr(), line) }
			r := &encryption.Rotator{DataDir: dataDir, Client: client, Progress: progress}
			res, err := r.Rotate(cmd.Context())
			if err != nil {
				return err
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rotated: Secrets are encrypted with %s (%d rewritten); dropped %s\n", res.NewKey, res.Rewritten, strings.Join(res.Dropped, ", "))
			return nil
		},
	}
	outputFlag(rotate, &output)
	cmd.AddCommand(status, rotate)
	return cmd
}
