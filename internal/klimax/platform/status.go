package platform

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/klimax/docker"
	"github.com/k3sm-dev/k3sm/internal/klimax/guest"
	"github.com/k3sm-dev/k3sm/internal/klimax/hostnet"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// Status is a read-only snapshot of the platform.
type Status struct {
	Driver     string               `json:"driver"`
	Machine    vm.State             `json:"machine"`
	DockerHost string               `json:"dockerHost"`
	Engine     EngineStatus         `json:"engine"`
	Network    NetworkStatus        `json:"network"`
	Mirrors    []docker.MirrorState `json:"mirrors"`
	APIHost    string               `json:"apiHost,omitempty"`
	Route      *hostnet.RouteStatus `json:"route,omitempty"` // nil when no route is needed
	Rules      *hostnet.RulesStatus `json:"rules,omitempty"` // nil when no rules are needed
	Errors     []string             `json:"errors,omitempty"`
}

// EngineStatus tells whether the Docker engine answers.
type EngineStatus struct {
	Reachable bool   `json:"reachable"`
	Version   string `json:"version,omitempty"`
	Error     string `json:"error,omitempty"`
}

// NetworkStatus is the shared bridge network as found.
type NetworkStatus struct {
	Name    string `json:"name"`
	Want    string `json:"want"`
	Exists  bool   `json:"exists"`
	Subnet  string `json:"subnet,omitempty"`
	Bridge  string `json:"bridge,omitempty"`
	Problem string `json:"problem,omitempty"`
}

// Status reads the state of every part without changing anything.
func (p *Platform) Status(ctx context.Context) (*Status, error) {
	st := &Status{Driver: p.driver.Name(), DockerHost: p.DockerHost(),
		Network: NetworkStatus{Name: p.opts.NetworkName, Want: p.bridge.String()}}
	ms, err := p.driver.Status(ctx)
	if err != nil {
		return nil, err
	}
	st.Machine = ms
	if ms.Phase != vm.PhaseRunning {
		return st, nil
	}
	if p.driver.NeedsRoute() {
		if gw, err := p.driver.HostAddress(ctx); err != nil {
			st.Errors = append(st.Errors, err.Error())
		} else {
			st.APIHost = gw.String()
			rs, err := p.router.Check(ctx, p.bridge, gw)
			if err != nil {
				st.Errors = append(st.Errors, err.Error())
			} else {
				st.Route = &rs
			}
		}
		rules, err := hostnet.CheckRules(ctx, p.driver, p.ruleSpec())
		if err != nil {
			st.Errors = append(st.Errors, err.Error())
		} else {
			st.Rules = &rules
		}
	} else if a, err := p.driver.HostAddress(ctx); err == nil {
		st.APIHost = a.String()
	}
	dc, err := p.Docker()
	if err != nil {
		st.Engine.Error = err.Error()
		return st, nil
	}
	defer dc.Close()
	v, err := dc.Ping(ctx)
	if err != nil {
		st.Engine.Error = err.Error()
		return st, nil
	}
	st.Engine = EngineStatus{Reachable: true, Version: v}
	info, err := dc.InspectNetwork(ctx, p.opts.NetworkName)
	if err != nil {
		st.Errors = append(st.Errors, err.Error())
	} else if info != nil {
		st.Network.Exists = true
		st.Network.Bridge = info.Bridge
		var subnets []string
		for _, s := range info.Subnets {
			subnets = append(subnets, s.String())
		}
		st.Network.Subnet = strings.Join(subnets, ",")
		if err := docker.CheckNetwork(info, p.networkSpec()); err != nil {
			st.Network.Problem = err.Error()
		}
	}
	for _, m := range p.cfg.Registries.Mirrors {
		ms, err := dc.MirrorState(ctx, p.mirrorSpec(m))
		if err != nil {
			st.Errors = append(st.Errors, err.Error())
		}
		st.Mirrors = append(st.Mirrors, ms)
	}
	return st, nil
}

// Check states.
const (
	Pass = "PASS"
	Warn = "WARN"
	Fail = "FAIL"
)

// Check is one doctor finding.
type Check struct {
	Name   string `json:"name"`
	Status string `json:"status"` // PASS, WARN or FAIL
	Detail string `json:"detail,omitempty"`
	Fix    string `json:"fix,omitempty"`
}

// Failed reports whether any check failed (doctor exits non-zero then).
func Failed(checks []Check) bool {
	for _, c := range checks {
		if c.Status == Fail {
			return true
		}
	}
	return false
}

// Doctor checks exactly what Up installs and says how to fix each problem.
func (p *Platform) Doctor(ctx context.Context) []Check {
	var out []Check
	add := func(name, status, detail, fix string) {
		out = append(out, Check{Name: name, Status: status, Detail: detail, Fix: fix})
	}
	st, err := p.Status(ctx)
	if err != nil {
		add("machine", Fail, err.Error(), fixFor(p.driver.Name()))
		return out
	}
	switch st.Machine.Phase {
	case vm.PhaseRunning:
		add("machine", Pass, fmt.Sprintf("%s %s running (%s)", st.Driver, st.Machine.Name, st.Machine.Detail), "")
	case vm.PhaseAbsent:
		add("machine", Fail, fmt.Sprintf("%s %s does not exist", st.Driver, st.Machine.Name), "run `klimax up`")
		return out
	default:
		add("machine", Fail, fmt.Sprintf("%s %s is %s", st.Driver, st.Machine.Name, st.Machine.Phase), "run `klimax up`")
		return out
	}
	if p.driver.Name() == "host" {
		// In the VM klimax installs the pinned kind; on the host it is the
		// user's, and every cluster command needs it.
		out = append(out, KindCheck(ctx, p.driver, guest.DefaultKind.Version))
	}
	if !st.Engine.Reachable {
		add("docker engine", Fail, st.Engine.Error, fixFor(p.driver.Name()))
		return out
	}
	add("docker engine", Pass, "version "+st.Engine.Version+" at "+orDefault(st.DockerHost), "")
	switch {
	case !st.Network.Exists:
		add("network "+st.Network.Name, Fail, "missing (want "+st.Network.Want+")", "run `klimax up`")
	case st.Network.Problem != "":
		add("network "+st.Network.Name, Fail, st.Network.Problem, "see the fix above")
	default:
		add("network "+st.Network.Name, Pass, st.Network.Subnet+" on "+st.Network.Bridge, "")
	}
	for _, m := range st.Mirrors {
		name := "mirror " + m.Name
		switch {
		case !m.Exists:
			add(name, Fail, "container missing", "run `klimax up`")
		case !m.Running:
			add(name, Fail, "container "+m.Status, "run `klimax up`")
		case !m.Current:
			add(name, Warn, "running with an older configuration", "run `klimax up` to re-create it (the cache is kept)")
		default:
			add(name, Pass, "running "+m.Image, "")
		}
	}
	if p.driver.NeedsRoute() {
		if st.Rules == nil {
			add("no-SNAT rules", Fail, "could not be read", "run `klimax up`")
		} else if !st.Rules.OK() {
			add("no-SNAT rules", Fail, strings.Join(st.Rules.Problems, "; "), "run `klimax up`")
		} else {
			add("no-SNAT rules", Pass, fmt.Sprintf("%s <-> %s on lima0, persisted", p.bridge, st.Rules.VMNet), "")
		}
		switch {
		case st.Route == nil:
			add("host route", Fail, "could not be read", "run `klimax up`")
		case !st.Route.Present:
			add("host route", Fail, "no route for "+p.bridge.String(), "run `klimax up` (asks for sudo)")
		case !st.Route.Correct:
			add("host route", Fail, fmt.Sprintf("%s goes via %s, not the VM at %s", p.bridge, st.Route.Gateway, st.APIHost), "run `klimax up` (asks for sudo)")
		default:
			add("host route", Pass, fmt.Sprintf("%s via %s", p.bridge, st.Route.Gateway), "")
		}
	}
	for _, e := range st.Errors {
		add("status", Warn, e, "")
	}
	return out
}

func orDefault(h string) string {
	if h == "" {
		return defaultDockerHost()
	}
	return h
}

func fixFor(driver string) string {
	if driver == "host" {
		return "start the local Docker engine (e.g. `sudo systemctl start docker`, or hack/start-docker.sh)"
	}
	return "run `klimax up`; if it keeps failing, `klimax up --show-vm-logs`"
}

// KindCheck runs `kind version` where clusters are made: FAIL when kind is
// missing or does not run, WARN when it is not the version klimax pins (its
// node images and config fields are those of that version).
func KindCheck(ctx context.Context, r vm.Runner, want string) Check {
	install := "install kind " + want + ": `go install sigs.k8s.io/kind@" + want + "` (puts it in $(go env GOPATH)/bin; add that to PATH)"
	res, err := r.Run(ctx, []string{"kind", "version"}, vm.RunOptions{Timeout: 20 * time.Second})
	if err != nil {
		return Check{Name: "kind", Status: Fail, Detail: "`kind version` failed: " + err.Error(), Fix: install}
	}
	// "kind v0.32.0 go1.25.5 linux/amd64"
	f := strings.Fields(string(res.Stdout))
	if len(f) < 2 || f[0] != "kind" {
		return Check{Name: "kind", Status: Fail, Detail: fmt.Sprintf("`kind version` printed %q", strings.TrimSpace(string(res.Stdout))), Fix: install}
	}
	if f[1] != want {
		return Check{Name: "kind", Status: Warn, Detail: fmt.Sprintf("kind %s; klimax is tested with %s", f[1], want), Fix: install}
	}
	return Check{Name: "kind", Status: Pass, Detail: "kind " + f[1]}
}

// NetworkReady checks that `klimax up` made the Docker network clusters join,
// with the configured subnet. Without it kind would make its own "kind"
// network on a random subnet, outside every MetalLB pool and route.
func (p *Platform) NetworkReady(ctx context.Context) error {
	dc, err := p.Docker()
	if err != nil {
		return err
	}
	defer dc.Close()
	info, err := dc.InspectNetwork(ctx, p.opts.NetworkName)
	if err != nil {
		return fmt.Errorf("docker network %s: %w (is the engine up? run `klimax up`)", p.opts.NetworkName, err)
	}
	if info == nil {
		return fmt.Errorf("docker network %s does not exist: run `klimax up` first (kind would otherwise make it on a random subnet instead of %s)", p.opts.NetworkName, p.bridge)
	}
	if err := docker.CheckNetwork(info, p.networkSpec()); err != nil {
		return fmt.Errorf("docker network %s: %w", p.opts.NetworkName, err)
	}
	return nil
}
