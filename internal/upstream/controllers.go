package upstream

import (
	"fmt"
	"os"
	"slices"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/compatibility"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	cmfeatures "k8s.io/controller-manager/pkg/features"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// runControllers is the Controllers role: kube-scheduler and
// kube-controller-manager, each from its own upstream command and command
// line, in one process. If either returns the process exits with it, so
// the supervisor restarts both; upstream's own fatal paths (os.Exit,
// klog.Fatal, a panic) end the process anyway.
//
// Process-wide state of the two, at v1.37:
//   - flags: each command has its own flag set, but the feature-gate and
//     emulated-version flags write one registry and the logging flags are
//     applied to one klog; the server gives both the same ProcessFlags and
//     this role refuses to start if they differ. Flags are parsed (and the
//     feature gates set) one command after the other, before either runs.
//   - logging: logsapi.ValidateAndApply refuses a second call; the role
//     applies the shared configuration first and lets the components'
//     own calls pass when they find it unchanged.
//   - signals: server.SetupSignalHandler may be called once per process;
//     the scheduler always calls it (SIGTERM ends it, and so the process),
//     the controller-manager only with its alpha
//     ControllerManagerReleaseLeaderElectionLockOnExit gate, refused here.
//   - metrics, /configz: one legacyregistry, one configz set (under
//     different names): each component's /metrics and /configz also show
//     the other's.
//   - client-go warnings: the controller-manager silences them process-wide.
func runControllers(args []string) int {
	supervisor.RunAsChild()
	var cfg roleconfig.ControllersConfig
	if err := roleconfig.Read(roleconfig.Controllers, args, &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm:", err)
		return 2
	}
	if err := checkProcessFlagList(); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm:", err)
		return 2
	}
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged

	sched := stage(roleconfig.Scheduler, schedulerapp.NewSchedulerCommand(), cfg.Scheduler)
	cm := stage(roleconfig.ControllerManager, cmapp.NewControllerManagerCommand(), cfg.ControllerManager)
	for _, c := range []*staged{sched, cm} {
		go c.execute()
		select {
		case <-c.parsed:
		case code := <-c.done:
			fmt.Fprintf(os.Stderr, "k3sm: %s exited before it started (code %d)\n", c.name, code)
			return code
		}
	}
	if err := sameProcessFlags(sched.cmd, cm.cmd); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm:", err)
		return 2
	}
	if utilfeature.DefaultFeatureGate.Enabled(cmfeatures.ControllerManagerReleaseLeaderElectionLockOnExit) {
		fmt.Fprintf(os.Stderr, "k3sm: the feature gate %s is not supported: it makes the controller-manager install the SIGTERM handler the scheduler installs in the same process, which upstream allows once\n",
			cmfeatures.ControllerManagerReleaseLeaderElectionLockOnExit)
		return 2
	}
	if err := applyLogging(sched.cmd); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm: logging:", err)
		return 2
	}
	close(sched.proceed)
	close(cm.proceed)
	var code int
	var ended string
	select {
	case code = <-sched.done:
		ended = sched.name
	case code = <-cm.done:
		ended = cm.name
	}
	if code == 0 {
		code = 1 // neither ends on its own while supervised
	}
	logs.FlushLogs()
	fmt.Fprintf(os.Stderr, "k3sm: %s ended; the process exits with it (code %d)\n", ended, code)
	return code
}

// staged is an upstream command run by cli.Run (as its own process would
// run it), held between parsing its flags and running.
type staged struct {
	name    string
	cmd     *cobra.Command
	parsed  chan struct{} // closed once its flags are parsed and its feature gates set
	proceed chan struct{} // closed to let it run
	done    chan int      // its exit code
}

func stage(name string, cmd *cobra.Command, args []string) *staged {
	s := &staged{name: name, cmd: cmd, parsed: make(chan struct{}), proceed: make(chan struct{}), done: make(chan int, 1)}
	cmd.SetArgs(args)
	// RunE follows the parsing and PersistentPreRunE (where both set the
	// feature gates).
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, a []string) error {
		close(s.parsed)
		<-s.proceed
		return run(c, a)
	}
	return s
}

func (s *staged) execute() { s.done <- cli.Run(s.cmd) }

// processFlagNames are the flags upstream registers for process-wide state,
// from the packages that own them.
func processFlagNames() []string {
	fs := pflag.NewFlagSet("process", pflag.ContinueOnError)
	logsapi.AddFlags(logs.NewOptions(), fs)
	logs.AddFlags(fs)
	compatibility.NewComponentGlobalsRegistry().AddFlags(fs)
	var names []string
	fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	return names
}

// checkProcessFlagList guards an upgrade: a process-wide flag the server
// does not know it must give both components alike.
func checkProcessFlagList() error {
	for _, n := range processFlagNames() {
		if !slices.Contains(roleconfig.ProcessFlags, n) {
			return fmt.Errorf("upstream flag --%s sets process-wide state, but roleconfig.ProcessFlags does not list it", n)
		}
	}
	return nil
}

func sameProcessFlags(a, b *cobra.Command) error {
	for _, n := range roleconfig.ProcessFlags {
		fa, fb := a.Flags().Lookup(n), b.Flags().Lookup(n)
		if fa == nil || fb == nil {
			continue
		}
		if va, vb := fa.Value.String(), fb.Value.String(); va != vb {
			return fmt.Errorf("kube-scheduler and kube-controller-manager share a process, but --%s is %q for one and %q for the other", n, va, vb)
		}
	}
	return nil
}

// applyLogging applies the logging configuration cmd parsed, before the
// components apply theirs (the same) concurrently.
func applyLogging(cmd *cobra.Command) error {
	c := logs.NewOptions()
	fs := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	logsapi.AddFlags(c, fs)
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if cf := cmd.Flags().Lookup(f.Name); cf != nil && cf.Changed && err == nil {
			err = f.Value.Set(cf.Value.String())
		}
	})
	if err != nil {
		return err
	}
	return logsapi.ValidateAndApply(c, utilfeature.DefaultFeatureGate)
}
