package controlplane

import (
	"errors"
	"reflect"
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
	api := strings.Join(p.APIServer().Command().Args, " ")
	if !strings.Contains(api, "--enable-admission-plugins=NodeRestriction,PodNodeSelector") || !strings.HasSuffix(api, " --v=3") {
		t.Errorf("kube-apiserver command line lacks the extra args: %s", api)
	}
	s, err := p.Scheduler()
	if err != nil {
		t.Fatal(err)
	}
	if args := s.Command().Args; args[0] != roleconfig.Scheduler || args[len(args)-1] != "--v=4" {
		t.Errorf("kube-scheduler command line: %q", args)
	}
	cm := p.ControllerManager().Command().Args
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
