package k3smcmd

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/doctor"
	"github.com/k3sm-dev/k3sm/internal/server/status"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/grpclog"
)

// exitCode ends the process with code after the command printed its
// report (status's 3/4/5, doctor's 1); Execute prints nothing for it.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func newStatus() *cobra.Command {
	var dataDir, output string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show whether the cluster runs and the health of each component",
		Long: "One line per component: the server (supervisor), kine, kube-apiserver, kube-scheduler,\n" +
			"kube-controller-manager, runtimed, netd, the node (its Ready condition), the Service proxy and the\n" +
			"cluster DNS. Exit status: 0 running, 3 stopped, 4 degraded (the server runs but a component is\n" +
			"unhealthy, down, or impaired: runtimed whose cgroups do not enforce pods' CPU or memory limits),\n" +
			"5 not installed (no cluster at the data dir and no k3sm service).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			quietGRPC()
			if err := checkOutput(output); err != nil {
				return err
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: must be positive, e.g. 2s", timeout)
			}
			r, err := status.Check(cmd.Context(), dataDir, status.Options{Timeout: timeout})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				if err := writeJSON(out, r); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(out, "k3sm is %s (data dir %s)\n", strings.ReplaceAll(r.State, "-", " "), r.DataDir)
				if len(r.ServiceUnits) > 0 {
					fmt.Fprintf(out, "service: %s\n", strings.Join(r.ServiceUnits, ", "))
				}
				if len(r.Components) > 0 {
					tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "COMPONENT\tHEALTH\tPID\tRESTARTS\tDETAIL")
					for _, c := range r.Components {
						pid := "-"
						if c.Pid > 0 {
							pid = fmt.Sprint(c.Pid)
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", c.Name, c.Health, pid, c.Restarts, c.Detail)
					}
					tw.Flush()
				}
				if r.Hint != "" {
					fmt.Fprintln(out, r.Hint)
				}
			}
			if r.ExitCode != 0 {
				return exitCode(r.ExitCode)
			}
			return nil
		},
	}
	dataDirFlag(cmd, &dataDir)
	outputFlag(cmd, &output)
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "how long each component's health check may take")
	return cmd
}

func newDoctor() *cobra.Command {
	var dataDir, output string
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check what k3sm needs of this machine: PASS, WARN or FAIL with the fix",
		Long: "Checks privileges (and what they mean for the pod network), user namespaces, overlayfs, the Landlock\n" +
			"ABI, which pod limits the runtime's cgroups enforce (the running runtime's report), nftables, the ports\n" +
			"k3sm listens on, the data dir (writable, free space against the node's eviction thresholds), the\n" +
			"clock, the cluster's certificates and whether its datastore answers. On macOS:\n" +
			"privileges, APFS under the data dir, ports, the data dir, the clock and the certificates.\n" +
			"Exit status 1 when a check FAILs.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			quietGRPC()
			if jsonOut {
				output = "json"
			}
			if err := checkOutput(output); err != nil {
				return err
			}
			r := doctor.Run(doctor.Options{DataDir: dataDir})
			out := cmd.OutOrStdout()
			if output == "json" {
				if err := writeJSON(out, r); err != nil {
					return err
				}
			} else {
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				for _, c := range r.Checks {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Status, c.Name, c.Detail)
					if c.Fix != "" {
						fmt.Fprintf(tw, "\t\tfix: %s\n", c.Fix)
					}
				}
				tw.Flush()
				fmt.Fprintf(out, "result: %s (data dir %s)\n", r.Result, r.DataDir)
			}
			if r.Result == doctor.Fail {
				return exitCode(1)
			}
			return nil
		},
	}
	dataDirFlag(cmd, &dataDir)
	outputFlag(cmd, &output)
	cmd.Flags().BoolVar(&jsonOut, "json", false, "same as -o json")
	return cmd
}

// quietGRPC keeps gRPC's own retry warnings (an etcd datastore that does
// not answer) off the terminal of status and doctor: their report already
// says it, and the lines would break -o json read from both outputs.
func quietGRPC() {
	grpclog.SetLoggerV2(quietLogger{grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard)})
}

// quietLogger also replaces the depth logger, which gRPC's own components
// log through (the apiserver's storage package installs klog's at init).
type quietLogger struct{ grpclog.LoggerV2 }

func (quietLogger) InfoDepth(int, ...any)    {}
func (quietLogger) WarningDepth(int, ...any) {}
func (quietLogger) ErrorDepth(int, ...any)   {}
func (quietLogger) FatalDepth(_ int, args ...any) {
	fmt.Fprintln(os.Stderr, args...)
	os.Exit(1)
}
