package cli

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/nodeimage"
)

func nodeImageCmd(app *App) *cobra.Command {
	c := &cobra.Command{
		Use:   "node-image",
		Short: "Build the kind node image klimax clusters run, offline",
	}
	c.AddCommand(nodeImageBuildCmd(app))
	return c
}

func nodeImageBuildCmd(app *App) *cobra.Command {
	var opts nodeimage.Options
	c := &cobra.Command{
		Use:   "build",
		Short: "Build (or reuse) the node image from Debian packages and Go modules, and load it into Docker",
		Long: `Builds a kind node image without pulling any image: a Debian rootfs
(debootstrap) with systemd and containerd, Kubernetes built from the k3sm
source tree's k8s.io/kubernetes version, and every image kubeadm, the pod
network, local-path storage and MetalLB need, preloaded in containerd. It also
loads the registry image klimax's pull-through mirrors run. Parts are cached
by a version key under --cache-dir, so a machine builds them once; an image
already in the engine with the same key is reused.

Runs on Linux (as root for the first debootstrap), from the k3sm clone
(--source) with the Go toolchain; on macOS run it inside the klimax VM.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Out = app.Err
			start := time.Now()
			res, err := nodeimage.Build(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if len(res.MetalLBManifest) > 0 {
				mf := &cluster.Manifests{Dir: filepath.Join(app.klimaxHome(), "cache", "manifests")}
				if seeded, err := mf.Seed(nodeimage.MetalLBVersion, res.MetalLBManifest); err != nil {
					return err
				} else if seeded {
					fmt.Fprintf(app.Err, "seeded the MetalLB %s manifest in %s\n", nodeimage.MetalLBVersion, mf.Dir)
				}
			}
			how := "built"
			if res.Cached {
				how = "already built"
			}
			fmt.Fprintf(app.Out, "node image %s %s (key %s) in %s; registry mirror image %s\n", res.Tag, how, res.Key,
				time.Since(start).Round(time.Second), res.MirrorImage)
			fmt.Fprintf(app.Out, "klimax cluster create uses %s when kind.nodeVersion is %s (and kind.nodeImage is empty or %s); config: %s\n", res.Tag, ver(res.Tag), nodeimage.DefaultRepository, app.configPath())
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&opts.KubernetesVersion, "kubernetes-version", "", "Kubernetes version (default: the k8s.io/kubernetes version of the source tree's go.mod)")
	f.StringVar(&opts.Tag, "tag", "", "node image tag (default "+nodeimage.DefaultRepository+":<kubernetes version>)")
	f.StringVar(&opts.SourceDir, "source", ".", "the k3sm source tree (its go.mod pins what is built)")
	f.StringVar(&opts.CacheDir, "cache-dir", "", "where parts are cached (default $XDG_CACHE_HOME/klimax/node-image or ~/.cache/klimax/node-image)")
	f.BoolVar(&opts.Rebuild, "rebuild", false, "rebuild the image even when the engine has one with the same key (cached parts are reused)")
	return c
}

// ver is the tag part of an image reference.
func ver(ref string) string {
	if i := strings.LastIndex(ref, ":"); i >= 0 {
		return ref[i+1:]
	}
	return ref
}
