package pressure

import (
	"slices"
	"testing"
)

const mi = 1 << 20

func names(pods []Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// The kubelet's rankMemoryPressure: pods without stats, then pods above
// their requests, then by priority, then by usage above the request.
func TestRankAsTheKubelet(t *testing.T) {
	pods := []Pod{
		{Name: "guaranteed-within", RequestBytes: 64 * mi, UsageBytes: 10 * mi, HasStats: true},
		{Name: "burstable-within", RequestBytes: 32 * mi, UsageBytes: 10 * mi, HasStats: true},
		{Name: "besteffort-small", UsageBytes: 5 * mi, HasStats: true},
		{Name: "besteffort-big", UsageBytes: 200 * mi, HasStats: true},
		{Name: "important-over", Priority: 1000, RequestBytes: 10 * mi, UsageBytes: 500 * mi, HasStats: true},
		{Name: "low-priority-within", Priority: -10, RequestBytes: 100 * mi, UsageBytes: 1 * mi, HasStats: true},
		{Name: "no-stats", Priority: 5000},
		{Name: "burstable-over", RequestBytes: 100 * mi, UsageBytes: 150 * mi, HasStats: true},
	}
	Rank(pods)
	want := []string{
		"no-stats",            // no figures: first, whatever its priority
		"besteffort-big",      // over requests, priority 0, 200Mi above
		"burstable-over",      // over requests, priority 0, 50Mi above
		"besteffort-small",    // over requests, priority 0, 5Mi above
		"important-over",      // over requests but priority 1000
		"low-priority-within", // within requests: lowest priority first
		"burstable-within",    // priority 0, 22Mi below its request
		"guaranteed-within",   // priority 0, 54Mi below its request
	}
	if got := names(pods); !slices.Equal(got, want) {
		t.Errorf("ranking\n got %v\nwant %v", got, want)
	}
}

func TestIsCritical(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		prio int32
		want bool
	}{
		{nil, 0, false},
		{map[string]string{"kubernetes.io/config.source": "api"}, 1999999999, false},
		{nil, SystemCriticalPriority, true},
		{nil, 2000001000, true}, // system-node-critical
		{map[string]string{"kubernetes.io/config.source": "file"}, 0, true},
		{map[string]string{"kubernetes.io/config.mirror": "abc"}, 0, true},
	} {
		if got := IsCritical(tc.ann, tc.prio); got != tc.want {
			t.Errorf("IsCritical(%v, %d) = %v", tc.ann, tc.prio, got)
		}
	}
}

// The message is the kubelet's, with quantities as resource.Quantity
// prints them.
func TestMessage(t *testing.T) {
	obs := Observation{Memory: Memory{AvailableBytes: 81920 * 1024, TotalBytes: 8 << 30}, ThresholdBytes: 100 * mi}
	p := Pod{Name: "p", HasStats: true, Containers: []Container{
		{Name: "hog", UsageBytes: 204800 * 1024, HasUsage: true},
		{Name: "small", RequestBytes: 64 * mi, UsageBytes: 3 * mi, HasUsage: true},
		{Name: "over", RequestBytes: 64 * mi, UsageBytes: 65*mi + 4096, HasUsage: true},
	}}
	want := "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. " +
		"Container hog was using 200Mi, request is 0, has larger consumption of memory. " +
		"Container over was using 66564Ki, request is 64Mi, has larger consumption of memory. "
	if got := Message(obs, p); got != want {
		t.Errorf("message\n got %q\nwant %q", got, want)
	}
	if got, want := Message(obs, Pod{}), "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. "; got != want {
		t.Errorf("without stats: %q", got)
	}
}
