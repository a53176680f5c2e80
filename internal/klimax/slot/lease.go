package slot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

// LeaseMaxAge bounds how long a claim counts even when its process looks
// alive (a reused pid): longer than any kind create.
const LeaseMaxAge = 30 * time.Minute

// Leases records the slots that running klimax commands have picked but
// whose clusters the Docker engine does not show yet (kind publishes the
// API port only once its node runs). Claims are files <Dir>/<slot>.json
// written under an exclusive lock on <Dir>/lock, so two commands started
// at once never pick the same slot; a claim whose process is gone (or older
// than LeaseMaxAge) is ignored and removed. The lock is an flock, released
// by the kernel if its holder dies.
type Leases struct {
	Dir string
	// now and alive are replaced by tests.
	now   func() time.Time
	alive func(pid int) bool
}

// Lease is one claimed slot; Release gives it up (after kind create
// returned, the engine shows the cluster or there is none).
type Lease struct {
	Slot Slot
	path string
}

// Release removes the claim; it is safe on a nil lease and twice.
func (l *Lease) Release() error {
	if l == nil || l.path == "" {
		return nil
	}
	err := os.Remove(l.path)
	l.path = ""
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

type claim struct {
	Cluster string    `json:"cluster"`
	PID     int       `json:"pid"`
	Since   time.Time `json:"since"`
}

// PortCheck reports nil when an API port is free on the machine, or an
// error saying what holds it.
type PortCheck func(ctx context.Context, port int) error

// ClaimOptions say what to claim.
type ClaimOptions struct {
	Cluster string
	// Slot is the wanted slot; 0 = lowest free.
	Slot Slot
	// Hint makes Slot a preference (planned by a fleet, not pinned by the
	// user): when it is taken the lowest free slot is used instead.
	Hint bool
	// Used are the slots of existing clusters.
	Used []Slot
	// InUse, when set, is called under the lock for the slots of existing
	// clusters (added to Used): read before the lock, a cluster whose
	// create finished (and released its claim) in between would be missed.
	InUse func(ctx context.Context) ([]Slot, error)
	// PortFree, when set, skips (or, for a pinned slot, refuses) a slot
	// whose API port something else holds.
	PortFree PortCheck
}

// Claim picks a slot and records it, under the lock. The result says which
// slots were skipped because their port was in use (for a warning).
func (ls *Leases) Claim(ctx context.Context, o ClaimOptions) (*Lease, []string, error) {
	if ls == nil || ls.Dir == "" {
		if o.InUse != nil {
			more, err := o.InUse(ctx)
			if err != nil {
				return nil, nil, err
			}
			o.Used = append(append([]Slot(nil), o.Used...), more...)
		}
		s, skipped, err := pick(ctx, o, nil)
		return &Lease{Slot: s}, skipped, err
	}
	if err := os.MkdirAll(ls.Dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("slot leases: %w", err)
	}
	unlock, err := lockDir(ctx, filepath.Join(ls.Dir, "lock"))
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	if o.InUse != nil {
		more, err := o.InUse(ctx)
		if err != nil {
			return nil, nil, err
		}
		o.Used = append(append([]Slot(nil), o.Used...), more...)
	}
	claims := ls.live()
	leased := map[Slot]string{}
	for sl, c := range claims {
		if c.Cluster == o.Cluster && o.Cluster != "" {
			return nil, nil, fmt.Errorf("cluster %s is being created by another klimax command (pid %d) (fix: wait for it to finish)", c.Cluster, c.PID)
		}
		leased[sl] = fmt.Sprintf("cluster %s (klimax pid %d)", c.Cluster, c.PID)
	}
	s, skipped, err := pick(ctx, o, leased)
	if err != nil {
		return nil, skipped, err
	}
	data, _ := json.Marshal(claim{Cluster: o.Cluster, PID: os.Getpid(), Since: ls.clock()})
	path := filepath.Join(ls.Dir, strconv.Itoa(int(s))+".json")
	if err := atomicfile.WriteFileNoSync(path, data, 0o600); err != nil {
		return nil, skipped, fmt.Errorf("slot leases: %w", err)
	}
	return &Lease{Slot: s, path: path}, skipped, nil
}

func (ls *Leases) clock() time.Time {
	if ls.now != nil {
		return ls.now()
	}
	return time.Now()
}

// live reads the claims of live processes (caller holds the lock) and
// removes the others.
func (ls *Leases) live() map[Slot]claim {
	out := map[Slot]claim{}
	entries, _ := os.ReadDir(ls.Dir)
	alive := ls.alive
	if alive == nil {
		alive = processAlive
	}
	for _, e := range entries {
		n, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		v, err := strconv.Atoi(n)
		p := filepath.Join(ls.Dir, e.Name())
		data, rerr := os.ReadFile(p)
		var c claim
		if err != nil || rerr != nil || json.Unmarshal(data, &c) != nil || !Slot(v).Valid() ||
			!alive(c.PID) || ls.clock().Sub(c.Since) > LeaseMaxAge {
			os.Remove(p)
			continue
		}
		out[Slot(v)] = c
	}
	return out
}

// pick chooses the slot: pinned (refused when used, leased or its port is
// in use), or the hint when free, else the lowest free one.
func pick(ctx context.Context, o ClaimOptions, leased map[Slot]string) (Slot, []string, error) {
	used := map[Slot]bool{}
	for _, s := range o.Used {
		used[s] = true
	}
	free := func(s Slot) error {
		if used[s] {
			return fmt.Errorf("slot %d is already in use (pick another num, or let klimax choose)", s)
		}
		if who, ok := leased[s]; ok {
			return fmt.Errorf("slot %d is being created by %s (pick another num, or let klimax choose)", s, who)
		}
		if o.PortFree != nil {
			if err := o.PortFree(ctx, s.APIPort()); err != nil {
				return fmt.Errorf("slot %d: its API port %d is in use by another program: %v (fix: stop what listens on %d, or pick another num / --num)", s, s.APIPort(), err, s.APIPort())
			}
		}
		return nil
	}
	if o.Slot != 0 {
		if !o.Slot.Valid() {
			return 0, nil, fmt.Errorf("slot %d is out of range (use %d-%d)", o.Slot, Min, Max)
		}
		err := free(o.Slot)
		if err == nil {
			return o.Slot, nil, nil
		}
		if !o.Hint {
			return 0, nil, err
		}
	}
	var skipped []string
	for s := Slot(Min); s <= Max; s++ {
		if used[s] || leased[s] != "" {
			continue
		}
		if err := free(s); err != nil {
			skipped = append(skipped, fmt.Sprintf("port %d", s.APIPort()))
			continue
		}
		return s, skipped, nil
	}
	if len(skipped) > 0 {
		return 0, skipped, fmt.Errorf("no free slot: the others are in use and the API ports of %s are held by other programs (fix: free one of them, or delete a cluster)", strings.Join(skipped, ", "))
	}
	return 0, nil, fmt.Errorf("all %d slots are in use; delete a cluster first", Max)
}
