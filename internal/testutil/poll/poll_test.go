package poll

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// fakeT records a failure instead of ending the test (Fatalf's Goexit is
// left out: wait returns after fail).
type fakeT struct{ msg string }

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestUntil(t *testing.T) {
	n := 0
	Until(t, time.Second, "three tries", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Errorf("cond called %d times, want 3", n)
	}
	var ft fakeT
	start := time.Now()
	Until(&ft, 50*time.Millisecond, "never", func() bool { return false })
	if ft.msg != "timed out after 50ms waiting for never" {
		t.Errorf("message %q", ft.msg)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("gave up after %s, before the timeout", d)
	}
}

func TestUntilNilNamesLastError(t *testing.T) {
	n := 0
	UntilNil(t, time.Second, "nil", func() error {
		if n++; n < 2 {
			return errors.New("not yet")
		}
		return nil
	})
	var ft fakeT
	n = 0
	UntilNil(&ft, 30*time.Millisecond, "the answer", func() error { n++; return fmt.Errorf("try %d", n) })
	if want := fmt.Sprintf("timed out after 30ms waiting for the answer: try %d", n); ft.msg != want {
		t.Errorf("message %q, want %q", ft.msg, want)
	}
}

func TestEveryStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var ft fakeT
	start := time.Now()
	Every(&ft, ctx, time.Hour, time.Hour, "a cancelled wait", func() error { return errors.New("down") })
	if ft.msg != "stopped waiting for a cancelled wait (context canceled): down" || time.Since(start) > time.Second {
		t.Errorf("message %q after %s", ft.msg, time.Since(start))
	}
}
