package k3smcmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/audit"
	"github.com/k3sm-dev/k3sm/internal/server/certs"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/encryption"
	"github.com/k3sm-dev/k3sm/internal/server/snapshot"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// addOps registers the operations commands (docs/operations.md) and makes
// `k3sm server` explain a path given to a bare --audit-log after a space.
func addOps(root *cobra.Command) {
	root.AddCommand(newSnapshot(), newSecretsEncrypt(), newCertificate(), newStatus(), newDoctor(), newImage())
	root.AddCommand(newInstall(), newUninstall(), newToken(), newAgent())
	for _, c := range root.Commands() {
		if c.Name() != "server" {
			continue
		}
		orig := c.Args
		c.Args = func(cmd *cobra.Command, args []string) error {
			if f := cmd.Flags().Lookup("audit-log"); f != nil && f.Changed && f.Value.String() == controlplane.AuditLogDefault && len(args) > 0 {
				return fmt.Errorf("--audit-log takes a path only after '=': --audit-log=%s (a bare --audit-log writes <data-dir>/logs/audit.log)", args[0])
			}
			if orig != nil {
				return orig(cmd, args)
			}
			return nil
		}
	}
}

// addOpsFlags: snapshots, secrets encryption and the audit log of `k3sm server`.
func addOpsFlags(f *pflag.FlagSet, o *controlplane.Ops) {
	f.BoolVar(&o.SecretsEncryption, "secrets-encryption", false, "encrypt Secrets at rest (aescbc); takes effect on the start that creates the cluster")
	f.StringVar(&o.AuditLog, "audit-log", "", "write the apiserver's audit log (bare: <data-dir>/logs/audit.log; --audit-log=PATH elsewhere); policy <data-dir>/server/audit-policy.yaml")
	f.Lookup("audit-log").NoOptDefVal = controlplane.AuditLogDefault
	f.DurationVar(&o.SnapshotSchedule, "snapshot-schedule", 0, "save a snapshot this often (a Go duration such as 12h; 0: never)")
	f.IntVar(&o.SnapshotRetention, "snapshot-retention", o.SnapshotRetention, "scheduled snapshots kept (the newest)")
	f.StringVar(&o.SnapshotDir, "snapshot-dir", "", "where scheduled snapshots go (default <data-dir>/server/snapshots)")
}

// opsAddon prepares the encryption configuration and the audit policy
// before the apiserver starts, and runs the snapshot schedule once the
// server is up.
func opsAddon() controlplane.Addon {
	return controlplane.Addon{
		Early: func(_ context.Context, p *controlplane.Plane, s *supervisor.Supervisor) error {
			o := &p.Cfg.Ops
			path, err := encryption.Prepare(p.Layout, o.SecretsEncryption, s.Log, time.Now())
			if err != nil {
				return err
			}
			o.EncryptionProviderConfig = path
			if o.AuditLog != "" {
				if o.AuditPolicyFile, err = audit.Prepare(p.Layout, o.AuditLog, s.Log); err != nil {
					return err
				}
			}
			return nil
		},
		Ready: func(ctx context.Context, p *controlplane.Plane, s *supervisor.Supervisor) error {
			o := p.Cfg.Ops
			go watchCertificates(ctx, p.Cfg.DataDir, s.Log, 24*time.Hour)
			if o.SnapshotSchedule > 0 {
				s.Log.Info("snapshots scheduled", "every", o.SnapshotSchedule.String(), "keep", o.SnapshotRetention, "dir", o.SnapshotDir)
				go snapshot.Schedule(ctx, p.Cfg.DataDir, o.SnapshotDir, o.SnapshotSchedule, o.SnapshotRetention, s.Log)
			}
			return nil
		},
	}
}

// dataDirFlag adds --data-dir, defaulting as `k3sm server` does ($K3SM_DATA_DIR, then the default).
func dataDirFlag(cmd *cobra.Command, dataDir *string) {
	cmd.Flags().StringVar(dataDir, "data-dir", controlplane.DefaultDataDir(), "the server's data directory ($K3SM_DATA_DIR)")
}

// outputFlag adds -o/--output (text or json).
func outputFlag(cmd *cobra.Command, output *string) {
	cmd.Flags().StringVarP(output, "output", "o", "text", "output format: text or json")
}

func checkOutput(output string) error {
	if output != "text" && output != "json" {
		return fmt.Errorf("--output %q: use text or json", output)
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// serverRunning reports whether a server holds the data dir's lock.
func serverRunning(dataDir string) (bool, error) {
	release, err := controlplane.LockDataDir(dataDir)
	if err != nil {
		return true, err
	}
	release()
	return false, nil
}

// watchCertificates warns, at once and then every period, about
// certificates that are expired or within pki.RenewBefore of expiry: the
// components read them only at start, so a server that runs for months
// renews its leaves only when restarted.
func watchCertificates(ctx context.Context, dataDir string, log *slog.Logger, period time.Duration) {
	for {
		list, err := certs.Check(dataDir, time.Now())
		if err != nil {
			log.Warn("certificate check failed", "err", err)
		}
		for _, c := range list {
			if c.Status != "ok" {
				log.Warn("certificate needs attention: restart the server to renew leaves (or stop it and run `k3sm certificate rotate`); for a CA see docs/operations.md",
					"certificate", c.Name, "expires", c.NotAfter.UTC().Format(time.DateTime), "status", c.Status)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}
