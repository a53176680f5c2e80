//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/k3sm-dev/k3sm/internal/agent/apilb"
)

type mode string

const (
	modeKill      mode = "kill"
	modePartition mode = "partition"
)

const (
	// workers create ConfigMaps side by side, each pausing pace after an
	// acknowledged create and retryPause after a failed one.
	workers    = 4
	pace       = 20 * time.Millisecond
	retryPause = 20 * time.Millisecond
	// failoverTimeout bounds the wait for the first write after a kill;
	// after is how long the writers go on once it came.
	failoverTimeout = 3 * time.Minute
	after           = 3 * time.Second
	cmLease         = "kube-controller-manager"
	schedLease      = "kube-scheduler"
)

// round is one kill's figures; times are from the kill.
type round struct {
	N      int
	Mode   mode
	Killed int // the server killed: the kube-controller-manager lease's holder
	// SchedToo: it held the kube-scheduler lease too.
	SchedToo bool
	Procs    int           // processes SIGKILLed
	Gone     time.Duration // when none was left in its namespace (polled every 5 ms)
	// Failover: the first acknowledged create (201) among the requests
	// started at or after the kill, at its response, minus the kill.
	Failover time.Duration
	// Gap: the longest time between two consecutive acknowledged creates
	// (by response time) where the later came after the kill.
	Gap time.Duration
	// InFlight: requests started before the kill and not answered by it;
	// Late: those of them acknowledged after the kill (not counted in
	// Failover).
	InFlight, Late int
	// Failed: requests that failed after the kill and before Failover,
	// by error.
	Failed int
	Errs   map[string]int
	// MovedTo: the server the balancer sent new connections to after;
	// Noticed: when it first logged the killed server unreachable (a
	// dial or a connection to it failed), -1 if it did not.
	MovedTo int
	Noticed time.Duration
	// Lease: the kube-controller-manager lease's acquireTime on another
	// server (NewHolder), minus the kill.
	Lease     time.Duration
	NewHolder int
	// Writes acknowledged in the round; Up and Endpoints: the killed
	// server's restart, to "k3sm is up" and to the kubernetes Service
	// listing all three again (from when it was up).
	Writes        int
	Up, Endpoints time.Duration
	// The longest silence in the restarted server's output before it was
	// up, and the line that ended it.
	Silence time.Duration
	Resumed string
	// Before: the acknowledged writes before the kill by the server that
	// answered them (its serving certificate); FirstBy: the server that
	// answered the first write after.
	Before  map[int]int
	FirstBy int
	// Zombie: creates started after the kill that the killed server
	// answered (its certificate): none, if the kill is one.
	Zombie int
}

// round runs kill n in mode m: find the lease holder, write through a
// balancer that prefers it, kill it, wait for the first write after, for
// the lease to move, then restart it.
func (b *bench) round(ctx context.Context, n int, m mode) (round, error) {
	r := round{N: n, Mode: m, Killed: -1, MovedTo: -1, NewHolder: -1}
	c, err := b.anyRunning(-1)
	if err != nil {
		return r, err
	}
	h, _, err := b.waitHolder(ctx, c, cmLease, -1, 2*time.Minute)
	if err != nil {
		return r, err
	}
	r.Killed = h
	if sh, _, err := holder(ctx, c, schedLease); err == nil && sh == h {
		r.SchedToo = true
	}
	victim := b.srv[h]
	// The balancer an agent would have, its first server the holder: the
	// writes go through the server that is killed.
	order := []string{victim.addr(), b.srv[(h+1)%servers].addr(), b.srv[(h+2)%servers].addr()}
	seen := &unreachable{server: victim.addr()}
	lb, err := apilb.New(apilb.Options{Listen: "127.0.0.1:0", Servers: order,
		Log: slog.New(lbLog{slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}), seen})})
	if err != nil {
		return r, err
	}
	lctx, lcancel := context.WithCancel(ctx)
	lbDone := make(chan struct{})
	go func() { _ = lb.Run(lctx); close(lbDone) }()
	defer func() { lcancel(); <-lbDone }()
	lbc, err := kubernetes.NewForConfig(b.traced(lb.URL()))
	if err != nil {
		return r, err
	}
	w := b.startWriter(lbc)
	defer w.stop()
	if err := w.waitSteady(ctx, lb, victim.addr()); err != nil {
		return r, err
	}

	logf("round %d (%s): killing server %d (%s), which holds the %s lease (and %s: %v)", n, m, h, victim.ip, cmLease, schedLease, r.SchedToo)
	var killAt time.Time
	if m == modePartition {
		// The machine vanishes: nothing it sends leaves any more, not
		// even the FIN or RST of the sockets its killed processes close.
		// The clock starts once the link is down.
		if err := ip("-n", victim.netns, "link", "set", "eth0", "down"); err != nil {
			return r, err
		}
		killAt = time.Now()
	}
	// Every process of the machine: the server's tree and whatever else
	// runs in its network namespace, read first, then killed at once.
	pids := machineProcs(victim)
	if m == modeKill {
		killAt = time.Now()
	}
	for _, pid := range pids {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			r.Procs++
		}
	}
	<-victim.p.done
	gone, err := waitNetnsEmpty(ctx, victim.netns)
	if err != nil {
		return r, err
	}
	r.Gone = gone.Sub(killAt)
	logf("round %d (%s): %d processes killed, the last gone %s ms after the kill", n, m, r.Procs, ms(r.Gone))

	deadline := time.Now().Add(failoverTimeout)
	for !w.createdSince(killAt, h) {
		if time.Now().After(deadline) {
			return r, fmt.Errorf("no write acknowledged within %s of killing server %d; the last errors: %v", failoverTimeout, h, w.errsSince(killAt))
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return r, err
		}
	}
	if err := sleep(ctx, after); err != nil {
		return r, err
	}
	w.stop()
	if i := slices.Index(order, lb.Current()); i >= 0 {
		r.MovedTo = (h + i) % servers
	}
	w.figures(killAt, h, &r)
	r.Noticed = -1
	if t := seen.at(); !t.IsZero() {
		r.Noticed = t.Sub(killAt)
	}
	logf("round %d (%s): first write %s ms after the kill (answered by server %d), longest gap %s ms, %d requests failed in between %v, "+
		"balancer now on server %d; writes before the kill answered by %v", n, m, ms(r.Failover), r.FirstBy, ms(r.Gap), r.Failed, r.Errs, r.MovedTo, r.Before)
	if r.Zombie > 0 {
		out, _ := exec.Command("ip", "-n", victim.netns, "-br", "link", "show", "eth0").CombinedOutput()
		logf("round %d (%s): the killed server answered %d creates started after the kill! its link: %s; processes in its namespace: %v",
			n, m, r.Zombie, strings.TrimSpace(string(out)), netnsProcs(victim.netns))
	}

	// The controllers' leases move to a server that runs.
	c, err = b.anyRunning(h)
	if err != nil {
		return r, err
	}
	nh, l, err := b.waitHolder(ctx, c, cmLease, h, 2*time.Minute)
	if err != nil {
		return r, err
	}
	r.NewHolder = nh
	if l.Spec.AcquireTime != nil {
		r.Lease = l.Spec.AcquireTime.Sub(killAt)
	} else {
		r.Lease = time.Since(killAt)
	}
	logf("round %d (%s): the %s lease moved to server %d %s ms after the kill", n, m, cmLease, nh, ms(r.Lease))

	// The killed server comes back from its data dir.
	if m == modePartition {
		if err := ip("-n", victim.netns, "link", "set", "eth0", "up"); err != nil {
			return r, err
		}
	}
	if r.Up, err = b.start(ctx, victim); err != nil {
		return r, err
	}
	r.Silence, r.Resumed = victim.p.silence, victim.p.resumed
	if r.Endpoints, err = b.waitEndpoints(ctx); err != nil {
		return r, err
	}
	logf("round %d (%s): server %d restarted: up in %s ms, the kubernetes Service lists the three %s ms later", n, m, h, ms(r.Up), ms(r.Endpoints))
	for _, name := range w.acked() {
		b.acked[name] = true
	}
	return r, nil
}

// holder returns the server holding lease name and the lease; -1 when the
// lease is not held (or has expired).
func holder(ctx context.Context, c kubernetes.Interface, name string) (int, *coordinationv1.Lease, error) {
	l, err := c.CoordinationV1().Leases("kube-system").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return -1, nil, err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return -1, l, nil
	}
	if time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
		return -1, l, nil
	}
	// The identity is <hostname>_<uuid>; every server has a hostname of
	// its own (its UTS namespace's).
	host, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	i, err := strconv.Atoi(strings.TrimPrefix(host, hostPrefix))
	if !strings.HasPrefix(host, hostPrefix) || err != nil || i < 0 || i >= servers {
		return -1, l, fmt.Errorf("lease %s is held by %q, not by one of the benchmark's servers", name, *l.Spec.HolderIdentity)
	}
	return i, l, nil
}

// waitHolder waits until lease name is held by a running server other
// than not.
func (b *bench) waitHolder(ctx context.Context, c kubernetes.Interface, name string, not int, timeout time.Duration) (int, *coordinationv1.Lease, error) {
	deadline := time.Now().Add(timeout)
	for {
		i, l, err := holder(ctx, c, name)
		if err == nil && i >= 0 && i != not && b.srv[i].running() {
			return i, l, nil
		}
		if time.Now().After(deadline) {
			id := ""
			if l != nil && l.Spec.HolderIdentity != nil {
				id = *l.Spec.HolderIdentity
			}
			return -1, nil, fmt.Errorf("lease %s not held by a running server (other than %d) after %s: holder %q, %v", name, not, timeout, id, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return -1, nil, err
		}
	}
}

type outcome int

const (
	created outcome = iota
	exists          // AlreadyExists: a retried create whose first try was applied
	failed
)

// attempt is one Create request.
type attempt struct {
	name       string
	start, end time.Time
	outcome    outcome
	err        string
	server     int // the server that answered (its certificate), -1: none
}

// timeoutErr stands for the client's 5 s request timeout, whichever form
// it took (the context's deadline, or http.Client's Timeout).
const timeoutErr = "request timeout (5 s)"

// unreachable records when the balancer first logged server unreachable.
type unreachable struct {
	server string
	mu     sync.Mutex
	first  time.Time
}

func (u *unreachable) at() time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.first
}

// lbLog passes the balancer's log on and watches it for its message
// "apiserver unreachable" about one server: a dial or a connection to it failed.
type lbLog struct {
	slog.Handler
	u *unreachable
}

func (h lbLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "apiserver unreachable" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "server" && a.Value.String() == h.u.server {
				h.u.mu.Lock()
				if h.u.first.IsZero() {
					h.u.first = r.Time
				}
				h.u.mu.Unlock()
			}
			return true
		})
	}
	return h.Handler.Handle(ctx, r)
}

func (h lbLog) WithAttrs(as []slog.Attr) slog.Handler { return lbLog{h.Handler.WithAttrs(as), h.u} }
func (h lbLog) WithGroup(g string) slog.Handler       { return lbLog{h.Handler.WithGroup(g), h.u} }

// writer creates ConfigMaps through one client, each retried until it is
// acknowledged, and records every request.
type writer struct {
	b       *bench
	started time.Time
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	tries   []attempt
}

func (b *bench) startWriter(c kubernetes.Interface) *writer {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{b: b, started: time.Now(), cancel: cancel}
	for range workers {
		w.wg.Go(func() { w.work(ctx, c) })
	}
	return w
}

func (w *writer) work(ctx context.Context, c kubernetes.Interface) {
	for ctx.Err() == nil {
		name := fmt.Sprintf("fo-%06d", w.b.next.Add(1))
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": "failover"}},
			Data: map[string]string{"name": name}}
		for {
			a := attempt{name: name, server: -1, start: time.Now()}
			_, err := c.CoreV1().ConfigMaps(ns).Create(context.WithValue(ctx, answeredBy{}, &a.server), cm, metav1.CreateOptions{})
			a.end = time.Now()
			switch {
			case err == nil:
				a.outcome = created
			case apierrors.IsAlreadyExists(err):
				a.outcome = exists
			case ctx.Err() != nil:
				return // stopped: neither acknowledged nor a failure
			default:
				a.outcome, a.err = failed, errClass(err)
			}
			w.mu.Lock()
			w.tries = append(w.tries, a)
			w.mu.Unlock()
			if a.outcome != failed {
				break
			}
			if sleep(ctx, retryPause) != nil {
				return
			}
		}
		if sleep(ctx, pace) != nil {
			return
		}
	}
}

// errClass is err without the request's method and URL; the forms of
// the client's request timeout are one.
func errClass(err error) string {
	s := err.Error()
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(s, "Client.Timeout exceeded") {
		return timeoutErr
	}
	if i := strings.Index(s, `": `); i >= 0 && strings.Contains(s[:i], "https://") {
		s = s[i+3:]
	}
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

func (w *writer) stop() {
	w.cancel()
	w.wg.Wait()
}

// waitSteady waits until the writes have gone through current for a
// second without a failure, at least 2 s after the writers started.
func (w *writer) waitSteady(ctx context.Context, lb *apilb.LB, current string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		now := time.Now()
		var ok, bad int
		w.mu.Lock()
		for i := len(w.tries) - 1; i >= 0 && w.tries[i].end.After(now.Add(-time.Second)); i-- {
			if w.tries[i].outcome == failed {
				bad++
			} else {
				ok++
			}
		}
		w.mu.Unlock()
		if now.Sub(w.started) >= 2*time.Second && ok >= 10 && bad == 0 && lb.Current() == current {
			return nil
		}
		if now.After(deadline) {
			return fmt.Errorf("the writes are not steady 1m after they started: %d acknowledged and %d failed in the last second, "+
				"the balancer on %s (want %s); errors %v", ok, bad, lb.Current(), current, w.errsSince(w.started))
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// createdSince says whether a request started at or after t was
// acknowledged with a create by a server other than killed.
func (w *writer) createdSince(t time.Time, killed int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.tries) - 1; i >= 0 && w.tries[i].end.After(t); i-- {
		if a := w.tries[i]; a.outcome == created && !a.start.Before(t) && a.server != killed {
			return true
		}
	}
	return false
}

func (w *writer) errsSince(t time.Time) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	errs := map[string]int{}
	for _, a := range w.tries {
		if a.outcome == failed && a.end.After(t) {
			errs[a.err]++
		}
	}
	return errs
}

// acked are the names acknowledged (created, or found to exist).
func (w *writer) acked() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, a := range w.tries {
		if a.outcome != failed {
			out = append(out, a.name)
		}
	}
	return out
}

// figures fills r's write figures for a kill of server killed at killAt,
// once the writers have stopped.
func (w *writer) figures(killAt time.Time, killed int, r *round) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	var acks []time.Time
	r.Before, r.FirstBy = map[int]int{}, -1
	for _, a := range w.tries {
		if a.outcome == created {
			acks = append(acks, a.end)
			r.Writes++
			if !a.start.Before(killAt) && a.server == killed {
				r.Zombie++
			} else if !a.start.Before(killAt) && (first.IsZero() || a.end.Before(first)) {
				first, r.FirstBy = a.end, a.server
			}
		}
		if a.outcome != failed && a.end.Before(killAt) {
			r.Before[a.server]++
		}
		if a.start.Before(killAt) && a.end.After(killAt) {
			r.InFlight++
			if a.outcome != failed {
				r.Late++
			}
		}
	}
	r.Failover = first.Sub(killAt)
	r.Errs = map[string]int{}
	for _, a := range w.tries {
		if a.outcome == failed && a.end.After(killAt) && a.start.Before(first) {
			r.Failed++
			r.Errs[a.err]++
		}
	}
	sort.Slice(acks, func(i, j int) bool { return acks[i].Before(acks[j]) })
	for i := 1; i < len(acks); i++ {
		if acks[i].After(killAt) {
			r.Gap = max(r.Gap, acks[i].Sub(acks[i-1]))
		}
	}
}

// verdict is the end's check that no acknowledged write was lost.
type verdict struct {
	acked, listed int
	lost          []string
}

// verify lists the ConfigMaps and checks every acknowledged one is there.
func (b *bench) verify(ctx context.Context) (verdict, error) {
	var v verdict
	c, err := b.anyRunning(-1)
	if err != nil {
		return v, err
	}
	var list *corev1.ConfigMapList
	for try := 0; ; try++ {
		list, err = c.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: "bench=failover"})
		if err == nil {
			break
		}
		if try == 10 || errors.Is(err, context.Canceled) {
			return v, err
		}
		if err := sleep(ctx, time.Second); err != nil {
			return v, err
		}
	}
	have := map[string]bool{}
	for _, cm := range list.Items {
		have[cm.Name] = true
	}
	v.acked, v.listed = len(b.acked), len(have)
	for name := range b.acked {
		if !have[name] {
			v.lost = append(v.lost, name)
		}
	}
	sort.Strings(v.lost)
	logf("%d acknowledged writes, %d ConfigMaps listed, %d lost", v.acked, v.listed, len(v.lost))
	return v, nil
}
