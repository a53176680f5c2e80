package fleet

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/config"
)

const full = `apiVersion: klimax.dev/v1alpha1
kind: Fleet
metadata:
  name: demo
spec:
  maxParallel: 2
  strategy: ContinueOnError
  defaults:
    nodeVersion: v1.34.0
    region: eu-west
    zone: eu-west-1a
    registries:
      mirrors: ["*"]
    addons:
      metricsServer: {enabled: true, version: v0.8.0, kubeletInsecureTLS: true}
    labels: {team: core, env: dev}
    workers: 1
  clusters:
  - mgmt
  - name: app1
    dependsOn: [mgmt]
    num: 7
    workers: 2
    nodeVersion: v1.35.0
    zone: eu-west-1b
    labels: {env: prod}
    registries: {mirrors: [registry-dockerio]}
  - name: app2
    dependsOn: [mgmt]
    workers: 0
    registries: {mirrors: []}
    addons: {metricsServer: {enabled: false}}
`

func TestParseFullManifest(t *testing.T) {
	f, err := Parse([]byte(full))
	if err != nil {
		t.Fatal(err)
	}
	r := f.Resolve()
	if len(r) != 3 || r[0].Name != "mgmt" || r[0].NodeVersion != "v1.34.0" || r[0].Mirrors != nil || !r[0].MetricsServer.KubeletInsecureTLS {
		t.Errorf("mgmt %+v", r[0])
	}
	if r[1].Num != 7 || r[1].NodeVersion != "v1.35.0" || r[1].Zone != "eu-west-1b" || r[1].Region != "eu-west" ||
		!reflect.DeepEqual(r[1].Labels, map[string]string{"team": "core", "env": "prod"}) || !reflect.DeepEqual(r[1].Mirrors, []string{"registry-dockerio"}) {
		t.Errorf("app1 %+v", r[1])
	}
	if r[2].Mirrors == nil || len(r[2].Mirrors) != 0 || r[2].MetricsServer.Enabled {
		t.Errorf("app2: mirrors [] must mean none and addon off: %+v", r[2])
	}
}

func TestInvalidManifests(t *testing.T) {
	head := "apiVersion: klimax.dev/v1alpha1\nkind: Fleet\nmetadata: {name: demo}\nspec:\n"
	cases := map[string]struct{ doc, want string }{
		"unknown top key":     {head + "  clusters: [a]\nstatus: {}\n", "status: unknown key"},
		"unknown spec key":    {head + "  parallel: 2\n  clusters: [a]\n", "spec.parallel: unknown key"},
		"unknown cluster key": {head + "  clusters:\n  - name: a\n    dependson: [b]\n", "spec.clusters[0].dependson: unknown key"},
		"unknown addon key":   {head + "  clusters: [a]\n  defaults: {addons: {metricsServer: {enable: true}}}\n", "spec.defaults.addons.metricsServer.enable: unknown key"},
		"wrong apiVersion":    {strings.Replace(head, "v1alpha1", "v1", 1) + "  clusters: [a]\n", "apiVersion"},
		"wrong kind":          {strings.Replace(head, "Fleet", "Cluster", 1) + "  clusters: [a]\n", "kind:"},
		"bad fleet name":      {strings.Replace(head, "demo", "Demo!", 1) + "  clusters: [a]\n", "metadata.name"},
		"no clusters":         {head + "  clusters: []\n", "spec.clusters: no clusters"},
		"bad cluster name":    {head + "  clusters: ['a;reboot']\n", "spec.clusters[0].name"},
		"duplicate name":      {head + "  clusters: [a, b, a]\n", `spec.clusters[2].name: duplicate cluster name "a"`},
		"duplicate num":       {head + "  clusters:\n  - {name: a, num: 3}\n  - {name: b, num: 3}\n", "spec.clusters[1].num: duplicate num 3"},
		"num out of range":    {head + "  clusters:\n  - {name: a, num: 100}\n", "spec.clusters[0].num"},
		"unknown dep":         {head + "  clusters:\n  - {name: a, dependsOn: [zz]}\n", `unknown cluster "zz"`},
		"self dep":            {head + "  clusters:\n  - {name: a, dependsOn: [a]}\n", "depends on itself"},
		"cycle":               {head + "  clusters:\n  - {name: a, dependsOn: [c]}\n  - {name: b, dependsOn: [a]}\n  - {name: c, dependsOn: [b]}\n  - d\n", "dependency cycle: a -> c -> b -> a"},
		"bad strategy":        {head + "  strategy: YOLO\n  clusters: [a]\n", "spec.strategy"},
		"negative parallel":   {head + "  maxParallel: -1\n  clusters: [a]\n", "spec.maxParallel"},
		"reserved label":      {head + "  clusters:\n  - {name: a, labels: {klimax.dev/fleet: x}}\n", "spec.clusters[0].labels.klimax.dev/fleet"},
		"bad label value":     {head + "  defaults: {labels: {k: 'a b'}}\n  clusters: [a]\n", "spec.defaults.labels.k"},
		"kubelet label":       {head + "  clusters:\n  - {name: a, labels: {app.kubernetes.io/part-of: x}}\n", "spec.clusters[0].labels.app.kubernetes.io/part-of: the kubelet refuses"},
		"kubelet default":     {head + "  defaults: {labels: {k8s.io/x: y}}\n  clusters: [a]\n", "fix: use a key of your own domain, e.g. example.com/x"},
		"workers negative":    {head + "  clusters:\n  - {name: a, workers: -1}\n", "spec.clusters[0].workers: -1 worker nodes is out of range"},
		"workers too many":    {head + "  defaults: {workers: 11}\n  clusters: [a]\n", "spec.defaults.workers"},
		"bad zone":            {head + "  clusters:\n  - {name: a, zone: 'eu west'}\n", "spec.clusters[0].zone"},
		"bad node version":    {head + "  clusters:\n  - {name: a, nodeVersion: 'v1;id'}\n", "spec.clusters[0].nodeVersion"},
		"type mismatch":       {head + "  maxParallel: lots\n  clusters: [a]\n", "lots"},
	}
	for name, tc := range cases {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", name, err, tc.want)
		}
	}
}

func TestCycleFoundInLargerGraph(t *testing.T) {
	f := &Fleet{APIVersion: APIVersion, Kind: Kind, Metadata: Metadata{Name: "x"}}
	for i := 0; i < 30; i++ {
		c := ClusterEntry{Name: fmt.Sprintf("c%d", i)}
		if i > 0 {
			c.DependsOn = []string{fmt.Sprintf("c%d", i-1)}
		}
		f.Spec.Clusters = append(f.Spec.Clusters, c)
	}
	if err := f.Validate(); err != nil {
		t.Fatalf("chain rejected: %v", err)
	}
	f.Spec.Clusters[0].DependsOn = []string{"c29"}
	err := f.Validate()
	if err == nil || !strings.Contains(err.Error(), "dependency cycle: c0 -> c29 -> c28") {
		t.Errorf("err = %v", err)
	}
}

func existingInfo(name string, s int, fleet string, deps ...string) cluster.Info {
	return cluster.Info{Name: name, Slot: s, Fleet: fleet, DependsOn: deps, Reachable: true}
}

func TestPlanCreateSlotsAndMembership(t *testing.T) {
	head := "apiVersion: klimax.dev/v1alpha1\nkind: Fleet\nmetadata: {name: demo}\nspec:\n  clusters:\n"
	f, err := Parse([]byte(head + "  - a\n  - {name: b, num: 2}\n  - c\n  - member\n  - other\n"))
	if err != nil {
		t.Fatal(err)
	}
	existing := []cluster.Info{existingInfo("member", 1, "demo"), existingInfo("other", 3, "")}
	p, err := PlanCreate(f, config.Default(), existing, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, it := range p.Items {
		got[it.Name] = fmt.Sprintf("%s/%d", it.Action, it.Slot)
	}
	want := map[string]string{"a": "create/4", "b": "create/2", "c": "create/5", "member": "exists/1", "other": "skip/3"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("plan %v, want %v", got, want)
	}
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "--adopt") || p.MaxParallel != 1 || !p.FailFast {
		t.Errorf("plan meta %+v", p)
	}
	p, _ = PlanCreate(f, config.Default(), existing, true, 3)
	if p.Items[4].Action != ActAdopt || p.MaxParallel != 3 {
		t.Errorf("adopt plan %+v", p.Items[4])
	}
	// A pinned num held by a cluster outside the manifest is refused before anything runs.
	_, err = PlanCreate(f, config.Default(), []cluster.Info{existingInfo("x", 2, "")}, false, 0)
	if err == nil || !strings.Contains(err.Error(), "num 2") {
		t.Errorf("pinned clash: %v", err)
	}
	g, _ := Parse([]byte(head + "  - {name: a, registries: {mirrors: [nope]}}\n"))
	if _, err := PlanCreate(g, config.Default(), nil, false, 0); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("unknown mirror: %v", err)
	}
	var sb strings.Builder
	p.Print(&sb)
	if !strings.Contains(sb.String(), "b        create  2     :7002") && !strings.Contains(sb.String(), "10.2.0.0/16") {
		t.Errorf("plan print:\n%s", sb.String())
	}
}

// fakeClusters is an in-memory cluster manager recording calls.
type fakeClusters struct {
	mu      sync.Mutex
	infos   map[string]cluster.Info
	created []cluster.CreateOptions
	deleted []string
	fail    map[string]bool
}

func (f *fakeClusters) List(ctx context.Context, sel string) ([]cluster.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []cluster.Info
	for _, i := range f.infos {
		out = append(out, i)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}
func (f *fakeClusters) Create(ctx context.Context, o cluster.CreateOptions) (*cluster.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, o)
	if f.fail[o.Name] {
		return nil, errors.New("boom")
	}
	in := cluster.Info{Name: o.Name, Slot: int(o.Slot), Fleet: o.Fleet, DependsOn: o.DependsOn}
	f.infos[o.Name] = in
	return &in, nil
}
func (f *fakeClusters) Delete(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, name)
	if f.fail[name] {
		return errors.New("boom")
	}
	delete(f.infos, name)
	return nil
}
func (f *fakeClusters) Label(ctx context.Context, name string, set map[string]string, rm []string, allow bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	in := f.infos[name]
	if v, ok := set[cluster.LabelFleet]; ok && allow {
		in.Fleet = v
	}
	f.infos[name] = in
	return nil
}

func TestExecuteCreateAdditiveAndDeleteReverse(t *testing.T) {
	f, err := Parse([]byte(full))
	if err != nil {
		t.Fatal(err)
	}
	fc := &fakeClusters{infos: map[string]cluster.Info{}, fail: map[string]bool{}}
	ctx := context.Background()
	existing, _ := fc.List(ctx, "")
	p, err := PlanCreate(f, config.Default(), existing, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := ExecuteCreate(ctx, p, fc).Err(); err != nil {
		t.Fatal(err)
	}
	if len(fc.created) != 3 || fc.created[0].Name != "mgmt" || fc.created[0].Fleet != "demo" {
		t.Fatalf("created %+v", fc.created)
	}
	for _, o := range fc.created {
		if o.Name == "app1" && (o.Slot != 7 || !reflect.DeepEqual(o.DependsOn, []string{"mgmt"}) || !o.MetricsServer.Enabled) {
			t.Errorf("app1 options %+v", o)
		}
		// workers: per cluster, else the default; an explicit 0 wins.
		if want := map[string]int{"mgmt": 1, "app1": 2, "app2": 0}[o.Name]; o.Workers != want {
			t.Errorf("%s workers %d, want %d", o.Name, o.Workers, want)
		}
	}
	// Second apply is additive: nothing new.
	existing, _ = fc.List(ctx, "")
	p, _ = PlanCreate(f, config.Default(), existing, false, 0)
	if len(p.Tasks(ActCreate)) != 0 {
		t.Errorf("re-apply would create %v", p.Tasks(ActCreate))
	}
	// Delete by fleet name uses recorded deps: mgmt last.
	existing, _ = fc.List(ctx, "")
	dp := PlanDelete("demo", nil, existing)
	if err := ExecuteDelete(ctx, dp, fc).Err(); err != nil {
		t.Fatal(err)
	}
	if len(fc.deleted) != 3 || fc.deleted[2] != "mgmt" {
		t.Errorf("delete order %v, want mgmt last", fc.deleted)
	}
}

func TestDeleteFromManifestKeepsForeignAndStopsOnDependentFailure(t *testing.T) {
	f, _ := Parse([]byte(full))
	fc := &fakeClusters{infos: map[string]cluster.Info{
		"mgmt": existingInfo("mgmt", 1, "demo"), "app1": existingInfo("app1", 7, "demo", "mgmt"), "app2": existingInfo("app2", 2, "other")},
		fail: map[string]bool{"app1": true}}
	existing, _ := fc.List(context.Background(), "")
	p := PlanDelete("demo", f, existing)
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "app2") {
		t.Errorf("warnings %v", p.Warnings)
	}
	r := ExecuteDelete(context.Background(), p, fc)
	if r.Outcomes["app1"] != Failed || r.Outcomes["mgmt"] != Skipped || r.Err() == nil {
		t.Errorf("outcomes %v", r.Outcomes)
	}
	if !reflect.DeepEqual(fc.deleted, []string{"app1"}) {
		t.Errorf("deleted %v: mgmt must be kept while its dependent remains", fc.deleted)
	}
}

// TestSchedulePropertyRandomDAGs checks, over random dependency graphs, that
// no task starts before all its deps finished successfully, that at most
// maxParallel run at once, that FailFast starts nothing after the first
// failure, and that ContinueOnError runs exactly the tasks not downstream of
// a failure.
func TestSchedulePropertyRandomDAGs(t *testing.T) {
	for seed := int64(1); seed <= 150; seed++ {
		rng := rand.New(rand.NewSource(seed))
		n := 1 + rng.Intn(14)
		tasks := make([]Task, n)
		for i := range tasks {
			tasks[i].Name = fmt.Sprintf("t%d", i)
			for j := 0; j < i; j++ {
				if rng.Intn(4) == 0 {
					tasks[i].Deps = append(tasks[i].Deps, fmt.Sprintf("t%d", j))
				}
			}
		}
		rng.Shuffle(n, func(i, j int) { tasks[i], tasks[j] = tasks[j], tasks[i] })
		fails := map[string]bool{}
		for _, tk := range tasks {
			if rng.Intn(6) == 0 {
				fails[tk.Name] = true
			}
		}
		maxPar := 1 + rng.Intn(4)
		failFast := rng.Intn(2) == 0
		delays := map[string]time.Duration{}
		for _, tk := range tasks {
			delays[tk.Name] = time.Duration(rng.Intn(3)) * time.Millisecond
		}

		var mu sync.Mutex
		running, peak := 0, 0
		finished := map[string]bool{}
		var started []string
		firstFailure := -1
		failureSeen := false
		hooks.launch = func(name string) {
			if failFast && failureSeen {
				t.Errorf("seed %d: %s launched after a FailFast failure", seed, name)
			}
		}
		hooks.finish = func(name string, err error) {
			if err != nil {
				failureSeen = true
			}
		}
		res := Schedule(context.Background(), tasks, maxPar, failFast, func(ctx context.Context, name string) error {
			mu.Lock()
			for _, tk := range tasks {
				if tk.Name == name {
					for _, d := range tk.Deps {
						if !finished[d] || fails[d] {
							t.Errorf("seed %d: %s started before dep %s succeeded", seed, name, d)
						}
					}
				}
			}
			started = append(started, name)
			running++
			if running > peak {
				peak = running
			}
			mu.Unlock()
			time.Sleep(delays[name])
			mu.Lock()
			defer mu.Unlock()
			running--
			finished[name] = true
			if fails[name] {
				if firstFailure < 0 {
					firstFailure = len(started)
				}
				return errors.New("fail")
			}
			return nil
		})
		hooks.launch, hooks.finish = nil, nil
		if peak > maxPar {
			t.Errorf("seed %d: %d ran at once, max %d", seed, peak, maxPar)
		}
		if len(res.Outcomes) != n {
			t.Errorf("seed %d: %d outcomes for %d tasks", seed, len(res.Outcomes), n)
		}
		// Expected downstream-of-failure set.
		deps := map[string][]string{}
		for _, tk := range tasks {
			deps[tk.Name] = tk.Deps
		}
		var blocked func(string) bool
		blocked = func(x string) bool {
			for _, d := range deps[x] {
				if fails[d] || blocked(d) {
					return true
				}
			}
			return false
		}
		for _, tk := range tasks {
			o := res.Outcomes[tk.Name]
			switch {
			case blocked(tk.Name) && o != Skipped && o != NotStarted:
				t.Errorf("seed %d: %s should be skipped, got %s", seed, tk.Name, o)
			case !failFast && !blocked(tk.Name) && fails[tk.Name] && o != Failed:
				t.Errorf("seed %d: %s should fail, got %s", seed, tk.Name, o)
			case !failFast && !blocked(tk.Name) && !fails[tk.Name] && o != Succeeded:
				t.Errorf("seed %d: ContinueOnError: %s should succeed, got %s", seed, tk.Name, o)
			case failFast && firstFailure < 0 && o != Succeeded:
				t.Errorf("seed %d: no failures but %s is %s", seed, tk.Name, o)
			}
		}
	}
}

func TestScheduleCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	tasks := []Task{{Name: "a"}, {Name: "b", Deps: []string{"a"}}}
	r := Schedule(ctx, tasks, 1, false, func(ctx context.Context, name string) error {
		cancel()
		return nil
	})
	if r.Outcomes["a"] != Succeeded || r.Outcomes["b"] != NotStarted {
		t.Errorf("outcomes %v", r.Outcomes)
	}
}

func TestReverse(t *testing.T) {
	r := Reverse([]Task{{Name: "a"}, {Name: "b", Deps: []string{"a"}}, {Name: "c", Deps: []string{"a", "b"}}})
	want := []Task{{Name: "a", Deps: []string{"b", "c"}}, {Name: "b", Deps: []string{"c"}}, {Name: "c"}}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("%+v", r)
	}
}

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden")

func TestDryRunPlanGolden(t *testing.T) {
	f, err := Parse([]byte(full))
	if err != nil {
		t.Fatal(err)
	}
	p, err := PlanCreate(f, config.Default(), []cluster.Info{existingInfo("app2", 1, "")}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	p.Print(&sb)
	path := filepath.Join("testdata", "plan.golden")
	if *updateGolden {
		os.WriteFile(path, []byte(sb.String()), 0o644)
	}
	want, err := os.ReadFile(path)
	if err != nil || sb.String() != string(want) {
		t.Errorf("plan differs from %s (%v):\n%s", path, err, sb.String())
	}
}
