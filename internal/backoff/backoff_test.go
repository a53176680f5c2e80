package backoff

import (
	"slices"
	"testing"
	"time"
)

func TestDoublesUpToMax(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 30 * time.Second}
	var got []time.Duration
	for range 7 {
		got = append(got, b.Next())
	}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if d := b.Delay(); d != 30*time.Second {
		t.Errorf("Delay %v, want the last Next", d)
	}
	b.Reset()
	if d := b.Delay(); d != 0 {
		t.Errorf("Delay after Reset %v, want 0", d)
	}
	if d := b.Next(); d != time.Second {
		t.Errorf("Next after Reset %v, want Initial", d)
	}
}

// TestFirstRetryImmediate: waiting Delay() before calling Next gives 0,
// Initial, 2*Initial ... (the kubelet's crash-loop back-off).
func TestFirstRetryImmediate(t *testing.T) {
	b := Backoff{Initial: 10 * time.Second, Max: 40 * time.Second}
	var got []time.Duration
	for range 5 {
		got = append(got, b.Delay())
		b.Next()
	}
	if want := []time.Duration{0, 10 * time.Second, 20 * time.Second, 40 * time.Second, 40 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestZeroValue(t *testing.T) {
	var b Backoff
	if d := b.Next(); d != 0 {
		t.Errorf("zero Backoff: %v", d)
	}
}
