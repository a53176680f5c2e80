package node

import (
	"slices"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
)

// A pod whose starts keep failing transiently is started again after 1 s,
// doubling up to 30 s; each pod has its own back-off.
func TestStartRetryBackoff(t *testing.T) {
	p := newProvider(nil, podspec.New(podspec.Config{}), "192.0.2.1", nil, nil, false)
	var got []time.Duration
	for range 7 {
		got = append(got, p.backoff("a"))
	}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(got, want) {
		t.Errorf("start retries %v, want %v", got, want)
	}
	if d := p.backoff("b"); d != time.Second {
		t.Errorf("another pod's first retry after %v, want 1s", d)
	}
	p.mu.Lock()
	p.state("a").starts.Reset() // as create does once a start succeeded
	p.mu.Unlock()
	if d := p.backoff("a"); d != time.Second {
		t.Errorf("retry after a successful start waits %v, want 1s", d)
	}
}
