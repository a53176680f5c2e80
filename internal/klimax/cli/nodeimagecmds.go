package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker"
	"github.com/k3sm-dev/k3sm/internal/klimax/nodeimage"
)

func nodeImageCmd(app *App) *cobra.Command {
	c := &cobra.Command{
		Use:   "node-image",
		Short: "Build the kind node image klimax clusters run, offline",
	}
	c.AddCommand(nodeImageBuildCmd(app), nodeImageSaveCmd(app), nodeImageLoadCmd(app))
	return c
}

// nodeImageSaveCmd writes the bundle an air-gapped machine loads.
func nodeImageSaveCmd(app *App) *cobra.Command {
	var tag, output string
	c := &cobra.Command{
		Use:   "save",
		Short: "Write the node image, the registry-mirror image and the MetalLB manifest to one file, for machines that cannot build them",
		Long: `Writes a bundle (a tar) with the node image built by ` + "`klimax node-image build`" + `,
the registry image klimax's mirrors run and the MetalLB manifest the build
seeded. On the other machine, ` + "`klimax node-image load <file>`" + ` puts them in place
and ` + "`klimax cluster create`" + ` needs nothing from the network.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			p, err := app.Platform()
			if err != nil {
				return err
			}
			dc, err := docker.New(p.DockerHost())
			if err != nil {
				return err
			}
			defer dc.Close()
			if tag == "" {
				tags, err := dc.ImageTags(ctx, nodeimage.DefaultRepository)
				if err != nil {
					return err
				}
				switch len(tags) {
				case 0:
					return fmt.Errorf("no %s image in the Docker engine: run `klimax node-image build` first", nodeimage.DefaultRepository)
				case 1:
					tag = tags[0]
				default:
					return fmt.Errorf("the engine has several node images (%s): pick one with --tag", strings.Join(tags, ", "))
				}
			}
			if output == "" {
				output = "klimax-node-" + ver(tag) + ".tar"
			}
			b := nodeimage.Bundle{Images: []string{tag, nodeimage.MirrorImage}, MetalLBVersion: nodeimage.MetalLBVersion}
			mf := filepath.Join(app.klimaxHome(), "cache", "manifests", "metallb", nodeimage.MetalLBVersion+".yaml")
			if b.MetalLBManifest, err = os.ReadFile(mf); err != nil {
				return fmt.Errorf("the MetalLB %s manifest is not in klimax's cache (%v): run `klimax node-image build`, which seeds it", nodeimage.MetalLBVersion, err)
			}
			return atomicOutput(output, func(w io.Writer) error {
				fmt.Fprintf(app.Err, "saving %s and %s to %s ...\n", tag, nodeimage.MirrorImage, output)
				return nodeimage.WriteBundle(ctx, dc, w, b, filepath.Dir(output))
			}, func() {
				fmt.Fprintf(app.Out, "bundle %s: %s, %s, MetalLB %s manifest; load it with `klimax node-image load %s`\n", output, tag, nodeimage.MirrorImage, nodeimage.MetalLBVersion, output)
			})
		},
	}
	c.Flags().StringVar(&tag, "tag", "", "node image to save (default: the only "+nodeimage.DefaultRepository+" image in the engine)")
	c.Flags().StringVarP(&output, "output", "o", "", "bundle file (default klimax-node-<version>.tar)")
	return c
}

// nodeImageLoadCmd loads a bundle written by save.
func nodeImageLoadCmd(app *App) *cobra.Command {
	return &cobra.Command{
		Use:   "load <bundle>",
		Short: "Load a bundle written by `klimax node-image save`: its images into Docker, its MetalLB manifest into klimax's cache",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			p, err := app.Platform()
			if err != nil {
				return err
			}
			dc, err := docker.New(p.DockerHost())
			if err != nil {
				return err
			}
			defer dc.Close()
			b, err := nodeimage.ReadBundle(cmd.Context(), dc, f)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if b.MetalLBVersion != "" {
				mf := &cluster.Manifests{Dir: filepath.Join(app.klimaxHome(), "cache", "manifests")}
				if _, err := mf.Seed(b.MetalLBVersion, b.MetalLBManifest); err != nil {
					return err
				}
			}
			fmt.Fprintf(app.Out, "loaded %s; MetalLB %s manifest cached\n", strings.Join(b.Images, ", "), b.MetalLBVersion)
			return nil
		},
	}
}

// atomicOutput writes a file through a temporary one renamed into place, so
// a failed save leaves no partial bundle.
func atomicOutput(path string, write func(io.Writer) error, done func()) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.partial")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	done()
	return nil
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
