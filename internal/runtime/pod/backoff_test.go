package pod

import (
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// A container's CrashLoopBackOff and ImagePullBackOff start at the
// manager's base and double up to its limit.
func TestNextBackOffDoublesToTheLimit(t *testing.T) {
	m := &Manager{cfg: Config{CrashLoopBackOffBase: 10 * time.Second, CrashLoopBackOffMax: 60 * time.Second,
		ImagePullBackOffBase: 5 * time.Second, ImagePullBackOffMax: 30 * time.Second}}
	c := m.newContainer(&runtimev1.ContainerSpec{Name: "c"}, false, nil)
	var got, pulls []time.Duration
	for range 6 {
		got = append(got, c.crashBackOff.Next())
		pulls = append(pulls, c.pullBackOff.Next())
	}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 60 * time.Second, 60 * time.Second, 60 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays %v, want %v", got, want)
		}
		if pulls[i] != want[i]/2 {
			t.Fatalf("pull delays %v, want half of %v", pulls, want)
		}
	}
}
