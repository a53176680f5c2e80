//go:build linux

package main

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestPercentiles(t *testing.T) {
	s := time.Second
	five := []time.Duration{5 * s, 1 * s, 3 * s, 2 * s, 4 * s}
	if got := median(five); got != 3*s {
		t.Errorf("median = %v, want 3s", got)
	}
	if got := p90(five); got != 5*s {
		t.Errorf("p90 of 5 = %v, want the largest", got)
	}
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if got := p90(ten); got != 9 {
		t.Errorf("p90 of 10 = %v, want the 9th", got)
	}
	if median(nil) != -1 || p90(nil) != -1 {
		t.Error("no samples: want -1")
	}
}

func TestFigures(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	kill := at(1000)
	w := &writer{tries: []attempt{
		{name: "a", start: at(900), end: at(950), outcome: created},
		{name: "b", start: at(960), end: at(990), outcome: created},
		// In flight at the kill: one fails, one is acknowledged late.
		{name: "c", start: at(995), end: at(1010), outcome: failed, err: "unexpected EOF", server: -1},
		{name: "d", start: at(998), end: at(1100), outcome: created},
		// Started after: fails, then the retry is the failover.
		{name: "c", start: at(1030), end: at(1040), outcome: failed, err: "EOF", server: -1},
		{name: "c", start: at(1060), end: at(1400), outcome: exists, server: 1},
		{name: "e", start: at(1050), end: at(1500), outcome: created, server: 1},
		{name: "f", start: at(1510), end: at(1520), outcome: created, server: 1},
	}}
	var r round
	w.figures(kill, 0, &r)
	if r.Failover != 500*time.Millisecond {
		t.Errorf("failover %v, want 500ms (e: the first create started after the kill; d started before it)", r.Failover)
	}
	if r.Gap != 400*time.Millisecond {
		t.Errorf("gap %v, want 400ms (d → e)", r.Gap)
	}
	if r.InFlight != 2 || r.Late != 1 {
		t.Errorf("in flight %d, late %d; want 2, 1", r.InFlight, r.Late)
	}
	if r.Failed != 2 || r.Errs["EOF"] != 1 || r.Errs["unexpected EOF"] != 1 {
		t.Errorf("failed %d %v", r.Failed, r.Errs)
	}
	if r.FirstBy != 1 || r.Zombie != 0 || r.Before[0] != 2 {
		t.Errorf("first by %d, zombie %d, before %v", r.FirstBy, r.Zombie, r.Before)
	}
	if r.Writes != 5 {
		t.Errorf("writes %d, want 5", r.Writes)
	}
	if got := w.acked(); len(got) != 6 {
		t.Errorf("acked %v, want a b d c e f", got)
	}
	// Were server 0 to answer a request started after its kill, that
	// would not be the failover.
	w.tries = append(w.tries, attempt{name: "g", start: at(1001), end: at(1002), outcome: created, server: 0})
	r = round{}
	w.figures(kill, 0, &r)
	if r.Failover != 500*time.Millisecond || r.Zombie != 1 {
		t.Errorf("with an answer of the killed server: failover %v, zombie %d", r.Failover, r.Zombie)
	}
}

func TestErrClass(t *testing.T) {
	for in, want := range map[error]string{
		errors.New(`Post "https://127.0.0.1:1/api/v1/namespaces/x/configmaps": unexpected EOF`):                                   "unexpected EOF",
		errors.New(`Post "https://127.0.0.1:1/api": net/http: request canceled (Client.Timeout exceeded while awaiting headers)`): timeoutErr,
		context.DeadlineExceeded: timeoutErr,
	} {
		if got := errClass(in); got != want {
			t.Errorf("errClass(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestLogLine(t *testing.T) {
	in := `time=2026-12-07T20:29:53.222Z level=WARN msg="component exited; restarting" component=kube-apiserver status="exit status 255" log=/tmp/x/kube-apiserver.log`
	if got, want := logLine(in), `level=WARN msg="component exited; restarting" component=kube-apiserver status="exit status 255"`; got != want {
		t.Errorf("logLine = %q, want %q", got, want)
	}
}
