package pod

import (
	"testing"
	"time"
)

func TestNextBackOffDoublesToTheLimit(t *testing.T) {
	var got []time.Duration
	d := time.Duration(0)
	for range 6 {
		d = nextBackOff(d, 10*time.Second, 60*time.Second)
		got = append(got, d)
	}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 60 * time.Second, 60 * time.Second, 60 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays %v, want %v", got, want)
		}
	}
}
