package k3smcmd

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/deploy"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
)

// deployConfig: the manifests folder and the HelmChart controller of `k3sm server`.
type deployConfig struct {
	Resync                time.Duration
	DisableHelmController bool
}

func addDeployFlags(f *pflag.FlagSet, d *deployConfig) {
	f.DurationVar(&d.Resync, "manifests-resync", deploy.DefaultResync,
		"re-apply every file of <data-dir>/server/manifests this often, bringing back deleted objects (changed files are applied within 2s)")
	f.BoolVar(&d.DisableHelmController, "disable-helm-controller", false, "do not install HelmChart resources (helm.cattle.io/v1); the HelmChart and HelmChartConfig CRDs are still installed")
}

// deployAddon installs the HelmChart and HelmChartConfig CRDs and starts the HelmChart
// controller and the manifests folder once authorization is verified.
func deployAddon(d *deployConfig) controlplane.Addon {
	return controlplane.Addon{
		Early: func(context.Context, *controlplane.Plane, *supervisor.Supervisor) error {
			if d.Resync < time.Second {
				return &controlplane.FieldError{Flag: "manifests-resync", Value: d.Resync.String(), Problem: "too short", Fix: "use 1s or more, e.g. 1m"}
			}
			return nil
		},
		Verified: func(ctx context.Context, p *controlplane.Plane, s *supervisor.Supervisor) error {
			rc, err := p.AdminConfig()
			if err != nil {
				return err
			}
			rc.UserAgent = "k3sm-deploy"
			ap, err := deploy.NewApplier(rc)
			if err != nil {
				return err
			}
			crd, err := deploy.Parse(deploy.CRDs())
			if err != nil {
				return err
			}
			if err := ap.ApplyAll(ctx, crd); err != nil {
				return fmt.Errorf("installing the HelmChart and HelmChartConfig CRDs: %w", err)
			}
			dir := p.Layout.ManifestsDir()
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return fmt.Errorf("manifests folder: %w", err)
			}
			if !d.DisableHelmController {
				charts := &deploy.Charts{RC: rc, Kubeconfig: p.Layout.Cred("admin"), Exe: p.Cfg.Executable,
					Log: s.Log.With("component", "helm-controller")}
				go func() {
					if err := charts.Run(ctx); err != nil && ctx.Err() == nil {
						s.Log.Error("HelmChart controller stopped", "err", err)
					}
				}()
			}
			events, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return err
			}
			s.Log.Info("applying manifests", "dir", dir, "resync", d.Resync.String())
			folder := &deploy.Folder{Dir: dir, Applier: ap, Events: events, Log: s.Log.With("component", "deploy"), Resync: d.Resync}
			go folder.Run(ctx)
			return nil
		},
	}
}
