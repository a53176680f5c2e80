package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/k3sm-dev/k3sm/internal/version"
	"io"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/ui"
)

// Execute runs klimax with the process's arguments and terminal and returns
// the exit code.
func Execute() int {
	app := &App{Streams: Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr,
		InTTY: ui.IsTerminal(os.Stdin), OutTTY: ui.IsTerminal(os.Stderr)}}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := NewRoot(app)
	err := root.ExecuteContext(ctx)
	var ee *ExitError
	if err != nil && !errors.As(err, &ee) {
		fmt.Fprintln(app.Err, "Error:", err)
	}
	return ExitCode(err)
}

// NewRoot builds the command tree around app.
func NewRoot(app *App) *cobra.Command {
	root := &cobra.Command{
		Use:   "klimax",
		Short: "Local fleets of kind clusters in one Lima VM (or on this Linux host)",
		Long: `klimax runs many local kind clusters in one Lima VM with Docker (macOS) or on
the local Docker engine (Linux), each with its own API port, subnets, MetalLB
pool, CoreDNS forwarding and access to shared pull-through registry mirrors.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(app.In)
	root.SetOut(app.Out)
	root.SetErr(app.Err)
	root.PersistentPreRun = func(*cobra.Command, []string) { quietLibraries(app.Debug, app.Err) }
	pf := root.PersistentFlags()
	pf.StringVar(&app.ConfigPath, "config", "", "config file (default ~/.klimax/config.yaml)")
	pf.BoolVar(&app.Debug, "debug", false, "print debug output")
	pf.StringVar(&app.LimaLogLevel, "lima-log-level", "", "limactl log level (debug, info, warn, error)")

	root.AddCommand(
		upCmd(app), downCmd(app), destroyCmd(app), statusCmd(app), doctorCmd(app), shellCmd(app),
		versionCmd(app), configCmd(app), dockerEnvCmd(app), dockerContextCmd(app),
		clusterCmd(app), fleetCmd(app), kubeconfigCmd(app), registryCmd(app), nodeImageCmd(app),
	)
	// cobra adds `completion bash|zsh|fish|powershell` itself.
	root.CompletionOptions.HiddenDefaultCmd = false
	return root
}

// output prints v as json or yaml, or calls text for "text"/"".
func output(w io.Writer, format string, v any, text func()) error {
	switch format {
	case "", "text":
		text()
		return nil
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return fmt.Errorf("unknown output format %q (use text, json or yaml)", format)
}

func versionCmd(app *App) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the klimax version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(app.Out, "klimax %s\n", version.Version)
			return nil
		},
	}
}

func configCmd(app *App) *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "Show or edit the klimax configuration"}
	c.AddCommand(&cobra.Command{
		Use:   "edit",
		Short: "Edit the config in $EDITOR; it is validated before it replaces the old one",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := config.EditOptions{}
			if app.InTTY {
				opts.Retry = func(err error) bool {
					fmt.Fprintln(app.Err, err)
					ok, _ := ui.Confirm(app.In, app.Err, "Edit again?")
					return ok
				}
			}
			c, err := config.Edit(cmd.Context(), app.configPath(), config.EditorCommand(app.In, app.Out, app.Err), opts)
			if errors.Is(err, config.ErrNoChange) {
				fmt.Fprintln(app.Out, "no changes")
				return nil
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(app.Out, "saved %s (vm %s, driver %s, %d mirrors); run `klimax up` to apply VM and registry changes\n",
				app.configPath(), c.VM.Name, c.VM.Driver, len(c.Registries.Mirrors))
			return nil
		},
	})
	var format string
	view := &cobra.Command{
		Use:   "view",
		Short: "Print the effective configuration (defaults filled in)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := app.Config()
			if err != nil {
				return err
			}
			if format == "json" {
				return output(app.Out, format, c, nil)
			}
			b, err := config.Marshal(c)
			if err != nil {
				return err
			}
			_, err = app.Out.Write(b)
			return err
		},
	}
	view.Flags().StringVarP(&format, "output", "o", "yaml", "output format: yaml or json")
	c.AddCommand(view, &cobra.Command{
		Use:   "path",
		Short: "Print the config file path",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(app.Out, app.configPath())
			return nil
		},
	})
	return c
}

func registryCmd(app *App) *cobra.Command {
	c := &cobra.Command{Use: "registry", Short: "Manage the pull-through registry mirrors"}
	c.AddCommand(&cobra.Command{
		Use:   "clean-cache",
		Short: "Empty the registry mirror caches (mirrors restart if they ran)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := app.Platform()
			if err != nil {
				return err
			}
			done := app.Progress().Step("clean registry caches")
			err = p.CleanCache(cmd.Context())
			done(err)
			return err
		},
	})
	return c
}

// quietLibraries keeps client-go's klog lines and API server warnings out
// of klimax's progress output; with --debug they go to w.
func quietLibraries(debug bool, w io.Writer) {
	klog.LogToStderr(false)
	if debug {
		klog.SetOutput(w)
		rest.SetDefaultWarningHandler(rest.NewWarningWriter(w, rest.WarningWriterOptions{}))
		return
	}
	klog.SetOutput(io.Discard)
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
}
