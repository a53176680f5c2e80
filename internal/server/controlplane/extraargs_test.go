package controlplane

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/spf13/pflag"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func TestWithExtraArgs(t *testing.T) {
	defaults := []string{"--kube-api-qps=200", "--controllers=*,-foo", "--leader-elect=false", "--profiling=false"}
	got := withExtraArgs(defaults, []string{
		"kube-api-qps=20",          // replaces k3sm's value
		"--v=2",                    // leading dashes accepted
		"controllers+=bar",         // extends k3sm's list
		"feature-gates=A=true",     // '=' inside the value kept
		"feature-gates=B=false",    // a repeated flag keeps both, in order
		"enable-garbage-collector", // a boolean without a value
		"node-monitor-period+=5s",  // += of a flag k3sm does not set
		"profiling=true",           // replaces a boolean
	})
	want := []string{"--controllers=*,-foo,bar", "--leader-elect=false", "--node-monitor-period=5s",
		"--kube-api-qps=20", "--v=2", "--feature-gates=A=true", "--feature-gates=B=false", "--enable-garbage-collector", "--profiling=true"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("withExtraArgs:\n got %q\nwant %q", got, want)
	}
	if got := withExtraArgs(defaults, nil); !reflect.DeepEqual(got, defaults) {
		t.Fatalf("no extra args changed the defaults: %q", got)
	}
}

// The real components' flags reach every command line k3sm builds.
func TestExtraArgsInComponentCommands(t *testing.T) {
	cfg := testConfig(t)
	cfg.ExtraArgs = map[string][]string{
		roleconfig.APIServer:         {"enable-admission-plugins+=PodNodeSelector", "v=3"},
		roleconfig.Scheduler:         {"v=4"},
		roleconfig.ControllerManager: {"kube-api-qps=20", "kube-api-burst=30"},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := NewPlane(cfg)
	if err != nil {
		t.Fatal(err)
	}
	apiComp, err := p.APIServer()
	if err != nil {
		t.Fatal(err)
	}
	api := strings.Join(apiComp.Command().Args, " ")
	if !strings.Contains(api, "--enable-admission-plugins=NodeRestriction,PodNodeSelector") || !strings.HasSuffix(api, " --v=3") {
		t.Errorf("kube-apiserver command line lacks the extra args: %s", api)
	}
	ctrl, err := p.Controllers()
	if err != nil {
		t.Fatal(err)
	}
	rc := readControllersConfig(t, ctrl.Command().Args)
	if args := rc.Scheduler; args[len(args)-1] != "--v=4" {
		t.Errorf("kube-scheduler command line: %q", args)
	}
	cm := rc.ControllerManager
	// One process, one klog: the scheduler's verbosity is the controller-manager's too.
	if cm[len(cm)-1] != "--v=4" {
		t.Errorf("kube-controller-manager command line does not share the scheduler's --v: %q", cm)
	}
	var qps []string
	for _, a := range cm {
		if strings.HasPrefix(a, "--kube-api-qps=") || strings.HasPrefix(a, "--kube-api-burst=") {
			qps = append(qps, a)
		}
	}
	if want := []string{"--kube-api-qps=20", "--kube-api-burst=30"}; !reflect.DeepEqual(qps, want) {
		t.Errorf("controller-manager rate flags %q, want only the user's %q", qps, want)
	}
}

// readControllersConfig reads the role config the Controllers command
// (`kube-controllers --config=FILE`) names.
func readControllersConfig(t *testing.T, args []string) roleconfig.ControllersConfig {
	t.Helper()
	if len(args) != 2 || args[0] != roleconfig.Controllers {
		t.Fatalf("controllers command line %q", args)
	}
	var rc roleconfig.ControllersConfig
	if err := roleconfig.Read(args[0], args[1:], &rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

// The scheduler and controller-manager share a process: a process-wide flag
// given to one is given to both, and two different values are refused.
func TestProcessFlagsShared(t *testing.T) {
	sched, cm := shareProcessFlags(
		[]string{"--config=c", "--feature-gates=A=true", "--feature-gates=B=false"},
		[]string{"--kube-api-qps=5", "--v=3", "--vmodule=x=2"})
	if want := []string{"--config=c", "--feature-gates=A=true", "--feature-gates=B=false", "--v=3", "--vmodule=x=2"}; !reflect.DeepEqual(sched, want) {
		t.Errorf("scheduler %q, want %q", sched, want)
	}
	if want := []string{"--kube-api-qps=5", "--v=3", "--vmodule=x=2", "--feature-gates=A=true", "--feature-gates=B=false"}; !reflect.DeepEqual(cm, want) {
		t.Errorf("controller-manager %q, want %q", cm, want)
	}
	for _, tc := range []struct {
		sched, cm []string
		ok        bool
	}{
		{[]string{"v=2"}, []string{"--v=2", "kube-api-qps=5"}, true},
		{[]string{"v=2"}, nil, true},
		{[]string{"v=2"}, []string{"v=4"}, false},
		{[]string{"feature-gates=A=true"}, []string{"feature-gates=A=false"}, false},
		{[]string{"feature-gates=A=true", "feature-gates=B=true"}, []string{"feature-gates=A=true"}, false},
		{[]string{"kube-api-qps=1"}, []string{"kube-api-qps=2"}, true}, // each its own client
	} {
		cfg := testConfig(t)
		cfg.ExtraArgs = map[string][]string{roleconfig.Scheduler: tc.sched, roleconfig.ControllerManager: tc.cm}
		err := cfg.Validate()
		if tc.ok != (err == nil) {
			t.Errorf("scheduler %q, controller-manager %q: %v", tc.sched, tc.cm, err)
		}
		if err != nil && !strings.Contains(err.Error(), "run in one process") {
			t.Errorf("error does not say why: %v", err)
		}
	}
}

func TestValidateExtraArgs(t *testing.T) {
	known := func(role string) *pflag.FlagSet {
		fs := pflag.NewFlagSet(role, pflag.ContinueOnError)
		fs.String("feature-gates", "", "")
		fs.StringSlice("enable-admission-plugins", nil, "")
		fs.Bool("profiling", true, "")
		return fs
	}
	for _, tc := range []struct {
		arg, want string
	}{
		{"feature-gates=A=true", ""},
		{"--profiling=false", ""},
		{"profiling", ""},
		{"enable-admission-plugins+=PodNodeSelector", ""},
		{"", "not NAME=VALUE"},
		{"=x", "not NAME=VALUE"},
		{"---x=1", "not NAME=VALUE"},
		{"no-such-flag=1", "kube-apiserver has no flag --no-such-flag; `k3sm kube-apiserver --help` lists its flags"},
		{"feature-gates", "--feature-gates of kube-apiserver needs a value"},
		{"profiling+=x", "is a boolean, not a list"},
	} {
		cfg := testConfig(t)
		cfg.ComponentFlags = known
		cfg.ExtraArgs = map[string][]string{roleconfig.APIServer: {tc.arg}}
		err := cfg.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.arg, err)
			}
			continue
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Flag != "kube-apiserver-arg" || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one on --kube-apiserver-arg saying %q", tc.arg, err, tc.want)
		}
	}
	// Without the components' flags (a build that does not link them) only
	// the syntax is checked.
	cfg := testConfig(t)
	cfg.ExtraArgs = map[string][]string{roleconfig.ControllerManager: {"no-such-flag=1"}}
	if err := cfg.Validate(); err != nil {
		t.Errorf("syntax-only check refused a well-formed arg: %v", err)
	}
}

// The scheduler's own flag set (the one `k3sm kube-scheduler` parses) checks
// the names, with upstream's normalization (kube_api_qps is kube-api-qps).
func TestValidateExtraArgsRealScheduler(t *testing.T) {
	flags := func(role string) *pflag.FlagSet {
		if role != roleconfig.Scheduler {
			return nil
		}
		return schedulerapp.NewSchedulerCommand().Flags()
	}
	cfg := testConfig(t)
	cfg.ComponentFlags = flags
	cfg.ExtraArgs = map[string][]string{roleconfig.Scheduler: {"v=2", "feature-gates=SchedulerQueueingHints=true", "kube_api_qps=10"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg = testConfig(t)
	cfg.ComponentFlags = flags
	cfg.ExtraArgs = map[string][]string{roleconfig.Scheduler: {"node-monitor-period=5s"}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "kube-scheduler has no flag --node-monitor-period") {
		t.Fatalf("a controller-manager flag given to the scheduler: %v", err)
	}
}

func testConfig(t *testing.T) *Config {
	t.Helper()
	c := Defaults()
	c.DataDir, c.NodeName, c.BindAddress = t.TempDir(), "n", "127.0.0.1"
	return &c
}

// The apiserver's process serves kine from a config naming the datastore
// and the socket the apiserver's --etcd-servers dials; what follows the
// kine flag is the apiserver's own command line.
func TestAPIServerProcessServesKine(t *testing.T) {
	p, err := NewPlane(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.APIServer()
	if err != nil {
		t.Fatal(err)
	}
	args := c.Command().Args
	if args[0] != roleconfig.APIServer {
		t.Fatalf("role %q", args[0])
	}
	path, upstream := roleconfig.SplitKine(args[1:])
	if path == "" {
		t.Fatalf("no %s in %q", roleconfig.KineFlag, args)
	}
	if !reflect.DeepEqual(upstream, apiserver{p: p}.Args()) {
		t.Errorf("after the kine flag:\n got %q\nwant %q", upstream, apiserver{p: p}.Args())
	}
	var kc roleconfig.KineConfig
	if err := roleconfig.ReadFile(roleconfig.Kine, path, &kc); err != nil {
		t.Fatal(err)
	}
	if want := "sqlite://" + p.Layout.DBFile() + "?" + KineSQLiteParams; kc.Endpoint != want {
		t.Errorf("endpoint %q, want %q", kc.Endpoint, want)
	}
	etcd := "--etcd-servers=" + kc.Listen
	if !slices.Contains(upstream, etcd) || c.Command().Dir != p.Layout.ServerDir() {
		t.Errorf("the apiserver (cwd %s) does not dial kine's %s: %q", c.Command().Dir, kc.Listen, upstream)
	}
}
