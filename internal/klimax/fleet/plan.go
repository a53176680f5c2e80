package fleet

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/slot"
)

// Action is what apply will do for one member.
type Action string

const (
	ActCreate  Action = "create"
	ActExists  Action = "exists"  // already a member: left alone (create is additive)
	ActAdopt   Action = "adopt"   // exists, not a member, --adopt: gets the fleet label
	ActSkip    Action = "skip"    // exists, not a member, no --adopt: warned and left alone
	ActDelete  Action = "delete"  // fleet delete
	ActAbsent  Action = "absent"  // fleet delete: nothing to delete
	ActForeign Action = "foreign" // fleet delete: exists but belongs elsewhere; kept
)

// Item is one planned member.
type Item struct {
	Resolved
	Action Action
	Slot   slot.Slot
	Note   string
}

// Plan is the full set of decisions, made before anything changes.
type Plan struct {
	Fleet       string
	MaxParallel int
	FailFast    bool
	Items       []Item
	Warnings    []string
}

// Clusters is what fleet needs from the cluster manager.
type Clusters interface {
	List(ctx context.Context, selector string) ([]cluster.Info, error)
	Create(ctx context.Context, o cluster.CreateOptions) (*cluster.Info, error)
	Delete(ctx context.Context, name string) error
	Label(ctx context.Context, name string, set map[string]string, remove []string, allowReserved bool) error
}

// PlanCreate decides every member's action and assigns slots to all clusters
// to be created (pinned nums first, then lowest free in manifest order), so
// parallel creates never race for a slot. maxParallel > 0 overrides the spec.
func PlanCreate(f *Fleet, cfg *config.Config, existing []cluster.Info, adopt bool, maxParallel int) (*Plan, error) {
	p := &Plan{Fleet: f.Metadata.Name, MaxParallel: f.Spec.MaxParallel, FailFast: f.Spec.Strategy != ContinueOnError}
	if maxParallel > 0 {
		p.MaxParallel = maxParallel
	}
	if p.MaxParallel < 1 {
		p.MaxParallel = 1
	}
	have := map[string]cluster.Info{}
	var used []slot.Slot
	for _, e := range existing {
		have[e.Name] = e
		if e.Slot > 0 {
			used = append(used, slot.Slot(e.Slot))
		}
	}
	mirrors := map[string]bool{"*": true}
	for _, m := range cfg.Registries.Mirrors {
		mirrors[m.Name] = true
	}
	alloc := slot.NewAllocator(used)
	for i, r := range f.Resolve() {
		for _, m := range r.Mirrors {
			if !mirrors[m] {
				return nil, fmt.Errorf("spec.clusters[%d] (%s): registry mirror %q is not in the klimax config (known: %s)", i, r.Name, m, strings.Join(cfg.MirrorNames(), ", "))
			}
		}
		it := Item{Resolved: r}
		if r.NodeVersion == "" {
			it.NodeVersion = cfg.Kind.NodeVersion
		}
		if e, ok := have[r.Name]; ok {
			it.Slot = slot.Slot(e.Slot)
			switch {
			case e.Fleet == f.Metadata.Name:
				it.Action, it.Note = ActExists, "already a member; unchanged"
			case adopt:
				it.Action, it.Note = ActAdopt, "exists; will join the fleet (--adopt)"
				if e.Fleet != "" {
					it.Note = fmt.Sprintf("exists in fleet %s; will move to %s (--adopt)", e.Fleet, f.Metadata.Name)
				}
			default:
				it.Action = ActSkip
				it.Note = "exists but is not a member; skipped (use --adopt to add it)"
				p.Warnings = append(p.Warnings, fmt.Sprintf("cluster %s exists and is not a member of fleet %s; skipping it (use --adopt to add it)", r.Name, f.Metadata.Name))
			}
		} else {
			it.Action = ActCreate
		}
		p.Items = append(p.Items, it)
	}
	for i := range p.Items {
		it := &p.Items[i]
		if it.Action == ActCreate && it.Num != 0 {
			if err := alloc.Reserve(slot.Slot(it.Num)); err != nil {
				return nil, fmt.Errorf("cluster %s num %d: %w", it.Name, it.Num, err)
			}
			it.Slot = slot.Slot(it.Num)
		}
	}
	for i := range p.Items {
		it := &p.Items[i]
		if it.Action == ActCreate && it.Slot == 0 {
			s, err := alloc.Next()
			if err != nil {
				return nil, fmt.Errorf("cluster %s: %w", it.Name, err)
			}
			it.Slot = s
		}
	}
	return p, nil
}

// PlanDelete lists members to delete: from a manifest (only clusters that
// carry this fleet's label are deleted) or, with f nil, every cluster
// labelled with fleet name; dependencies come from the recorded labels.
func PlanDelete(name string, f *Fleet, existing []cluster.Info) *Plan {
	p := &Plan{Fleet: name, MaxParallel: 4, FailFast: false}
	have := map[string]cluster.Info{}
	for _, e := range existing {
		have[e.Name] = e
	}
	if f != nil {
		if f.Spec.MaxParallel > 0 {
			p.MaxParallel = f.Spec.MaxParallel
		}
		for _, r := range f.Resolve() {
			it := Item{Resolved: r}
			e, ok := have[r.Name]
			switch {
			case !ok:
				it.Action, it.Note = ActAbsent, "does not exist"
			case e.Fleet != name:
				it.Action, it.Note = ActForeign, "exists but is not a member; kept"
				p.Warnings = append(p.Warnings, fmt.Sprintf("cluster %s is not a member of fleet %s (fleet label %q); not deleting it", r.Name, name, e.Fleet))
			default:
				it.Action, it.Slot = ActDelete, slot.Slot(e.Slot)
			}
			p.Items = append(p.Items, it)
		}
		return p
	}
	for _, e := range existing {
		if e.Fleet == name {
			p.Items = append(p.Items, Item{Resolved: Resolved{Name: e.Name, DependsOn: e.DependsOn}, Action: ActDelete, Slot: slot.Slot(e.Slot)})
		}
	}
	sort.Slice(p.Items, func(i, j int) bool { return p.Items[i].Name < p.Items[j].Name })
	return p
}

// Tasks returns the dependency graph of the items with the given action.
func (p *Plan) Tasks(a Action) []Task {
	var out []Task
	for _, it := range p.Items {
		if it.Action == a {
			out = append(out, Task{Name: it.Name, Deps: it.DependsOn})
		}
	}
	return out
}

// Print writes the plan as a table.
func (p *Plan) Print(w io.Writer) {
	strategy := "FailFast"
	if !p.FailFast {
		strategy = "ContinueOnError"
	}
	fmt.Fprintf(w, "Fleet %s (maxParallel %d, %s)\n", p.Fleet, p.MaxParallel, strategy)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tACTION\tSLOT\tAPI\tSERVICES\tPODS\tWORKERS\tDEPENDS ON\tNOTE")
	for _, it := range p.Items {
		s, api, svc, pod := "-", "-", "-", "-"
		if it.Slot.Valid() {
			s, api = fmt.Sprint(int(it.Slot)), fmt.Sprintf(":%d", it.Slot.APIPort())
			svc, pod = it.Slot.ServiceSubnet().String(), it.Slot.PodSubnet().String()
		}
		deps := strings.Join(it.DependsOn, ",")
		if deps == "" {
			deps = "-"
		}
		workers := "-"
		if it.Action == ActCreate {
			workers = fmt.Sprint(it.Workers)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", it.Name, it.Action, s, api, svc, pod, workers, deps, it.Note)
	}
	tw.Flush()
	for _, wmsg := range p.Warnings {
		fmt.Fprintln(w, "warning: "+wmsg)
	}
}

// ExecuteCreate adopts and creates as planned: adoptions first (they are
// quick label changes), then creates in dependency order.
func ExecuteCreate(ctx context.Context, p *Plan, cs Clusters) Result {
	byName := map[string]Item{}
	for _, it := range p.Items {
		byName[it.Name] = it
	}
	res := Result{Outcomes: map[string]Outcome{}, Errors: map[string]error{}}
	for _, it := range p.Items {
		if it.Action == ActAdopt {
			if err := cs.Label(ctx, it.Name, map[string]string{cluster.LabelFleet: p.Fleet}, nil, true); err != nil {
				res.Outcomes[it.Name], res.Errors[it.Name] = Failed, err
			} else {
				res.Outcomes[it.Name] = Succeeded
			}
		}
	}
	r := Schedule(ctx, p.Tasks(ActCreate), p.MaxParallel, p.FailFast, func(ctx context.Context, name string) error {
		it := byName[name]
		// A planned slot is a preference: only a num from the manifest pins.
		_, err := cs.Create(ctx, cluster.CreateOptions{Name: it.Name, Slot: it.Slot, SlotHint: it.Num == 0, NodeVersion: it.NodeVersion,
			Region: it.Region, Zone: it.Zone, Fleet: p.Fleet, DependsOn: it.DependsOn, Labels: it.Labels,
			Mirrors: it.Mirrors, MetricsServer: it.MetricsServer, Workers: it.Workers})
		return err
	})
	for k, v := range r.Outcomes {
		res.Outcomes[k] = v
	}
	for k, v := range r.Errors {
		res.Errors[k] = v
	}
	return res
}

// ExecuteDelete deletes members, dependents before their dependencies; a
// cluster whose dependent failed to delete is kept.
func ExecuteDelete(ctx context.Context, p *Plan, cs Clusters) Result {
	return Schedule(ctx, Reverse(p.Tasks(ActDelete)), p.MaxParallel, false, func(ctx context.Context, name string) error {
		return cs.Delete(ctx, name)
	})
}
