package fleet

import (
	"context"
	"fmt"
	"sort"
	"sync"
)

// Task is one unit of scheduled work with the tasks it must wait for.
type Task struct {
	Name string
	Deps []string // names of tasks that must succeed first; unknown names are treated as already satisfied
}

// Outcome of one task.
type Outcome string

const (
	Succeeded Outcome = "succeeded"
	Failed    Outcome = "failed"
	// Skipped: a dependency failed or was skipped.
	Skipped Outcome = "skipped"
	// NotStarted: FailFast stopped scheduling (or ctx ended) before it began.
	NotStarted Outcome = "not-started"
)

// Result is what happened to every task.
type Result struct {
	Outcomes map[string]Outcome
	Errors   map[string]error
}

// Err summarises failures, nil if every task succeeded.
func (r Result) Err() error {
	var names []string
	for n, o := range r.Outcomes {
		if o != Succeeded {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	msg := ""
	for _, n := range names {
		msg += fmt.Sprintf("\n  %s: %s", n, r.Outcomes[n])
		if e := r.Errors[n]; e != nil {
			msg += ": " + e.Error()
		}
	}
	return fmt.Errorf("%d of %d clusters did not complete:%s", len(names), len(r.Outcomes), msg)
}

// hooks observe scheduling decisions under the scheduler's lock (tests).
var hooks struct {
	launch func(name string)
	finish func(name string, err error)
}

// Schedule runs fn for every task once its dependencies have succeeded, with
// at most maxParallel running at once (<1 means 1). With failFast, the first
// failure stops new tasks from starting (running ones finish); otherwise only
// the failed task's dependents are skipped. The task list must be acyclic
// (Validate guarantees it for manifests).
func Schedule(ctx context.Context, tasks []Task, maxParallel int, failFast bool, fn func(ctx context.Context, name string) error) Result {
	if maxParallel < 1 {
		maxParallel = 1
	}
	known := map[string]bool{}
	for _, t := range tasks {
		known[t.Name] = true
	}
	res := Result{Outcomes: map[string]Outcome{}, Errors: map[string]error{}}
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	running := 0
	stop := false
	done := map[string]bool{}
	pending := append([]Task(nil), tasks...)

	mu.Lock()
	defer mu.Unlock()
	for {
		if ctx.Err() != nil {
			stop = true
		}
		// Resolve tasks whose fate is decided; start runnable ones in order.
		progressed := true
		for progressed {
			progressed = false
			for i := 0; i < len(pending); i++ {
				t := pending[i]
				ready, blocked := true, false
				for _, d := range t.Deps {
					if !known[d] {
						continue
					}
					if !done[d] {
						ready = false
					} else if res.Outcomes[d] != Succeeded {
						blocked = true
					}
				}
				switch {
				case blocked:
					res.Outcomes[t.Name] = Skipped
					done[t.Name] = true
				case stop:
					res.Outcomes[t.Name] = NotStarted
					done[t.Name] = true
				case ready && running < maxParallel:
					running++
					if hooks.launch != nil {
						hooks.launch(t.Name)
					}
					go func(name string) {
						err := fn(ctx, name)
						mu.Lock()
						defer mu.Unlock()
						running--
						done[name] = true
						if hooks.finish != nil {
							hooks.finish(name, err)
						}
						if err != nil {
							res.Outcomes[name] = Failed
							res.Errors[name] = err
							if failFast {
								stop = true
							}
						} else {
							res.Outcomes[name] = Succeeded
						}
						cond.Broadcast()
					}(t.Name)
				default:
					continue
				}
				pending = append(pending[:i], pending[i+1:]...)
				i--
				progressed = true
			}
		}
		if len(pending) == 0 && running == 0 {
			return res
		}
		if ctx.Err() == nil {
			// Wake on completion, and also when ctx ends.
			stopWatch := context.AfterFunc(ctx, func() {
				mu.Lock()
				cond.Broadcast()
				mu.Unlock()
			})
			cond.Wait()
			stopWatch()
		} else if running > 0 {
			cond.Wait()
		}
	}
}

// Reverse turns a dependency list around so that dependents run first (for
// deletes): a task now waits for every task that depended on it.
func Reverse(tasks []Task) []Task {
	rdeps := map[string][]string{}
	for _, t := range tasks {
		for _, d := range t.Deps {
			rdeps[d] = append(rdeps[d], t.Name)
		}
	}
	out := make([]Task, len(tasks))
	for i, t := range tasks {
		out[i] = Task{Name: t.Name, Deps: rdeps[t.Name]}
	}
	return out
}
