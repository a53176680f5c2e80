// Package poll is the tests' one wait-until helper: try a condition until it
// holds, and fail the test naming what it waited for when it does not in
// time.
package poll

import (
	"context"
	"errors"
	"time"
)

// Interval is how often Until and UntilNil try.
const Interval = 10 * time.Millisecond

// TB is the part of testing.TB the helpers use.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

var errNotYet = errors.New("condition not met")

// Until calls cond every Interval until it returns true. If timeout passes
// first it fails t (Fatalf) naming what and the timeout.
func Until(t TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	wait(t, context.Background(), timeout, Interval, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// UntilNil calls f every Interval until it returns nil. If timeout passes
// first it fails t (Fatalf) naming what, the timeout and f's last error.
func UntilNil(t TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	wait(t, context.Background(), timeout, Interval, what, f)
}

// Every is UntilNil for checks too costly to run every Interval (a
// cluster's API, a registry over HTTP): it calls f every interval, and
// also fails t, naming ctx's error and f's last, when ctx ends first.
func Every(t TB, ctx context.Context, timeout, interval time.Duration, what string, f func() error) {
	t.Helper()
	wait(t, ctx, timeout, interval, what, f)
}

func wait(t TB, ctx context.Context, timeout, interval time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			fail(t, timeout, what, err)
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stopped waiting for %s (%v): %v", what, ctx.Err(), err)
			return
		case <-time.After(interval):
		}
	}
}

func fail(t TB, timeout time.Duration, what string, err error) {
	t.Helper()
	if err == errNotYet {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	} else {
		t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
	}
}
