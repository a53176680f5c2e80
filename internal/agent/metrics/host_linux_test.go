//go:build linux

package metrics

import "testing"

func TestParseProcStat(t *testing.T) {
	in := []byte("cpu  100 5 50 9000 40 3 2 1 7 0\ncpu0 50 2 25 4500 20 1 1 0 0 0\nintr 1 2 3\n")
	got, err := parseProcStat(in)
	// user+nice+system+irq+softirq+steal = 161 ticks of 10 ms; idle,
	// iowait and guest (already in user) are not counted.
	if err != nil || got != 161*10_000_000 {
		t.Fatalf("got %d %v", got, err)
	}
	if _, err := parseProcStat([]byte("intr 1\n")); err == nil {
		t.Fatal("no cpu line accepted")
	}
}

func TestParseMeminfo(t *testing.T) {
	in := []byte("MemTotal:       1000 kB\nMemFree:         200 kB\nMemAvailable:    600 kB\nInactive(file):  300 kB\n")
	got, err := parseMeminfo(in)
	if err != nil || got != (1000-200-300)*1024 {
		t.Fatalf("got %d %v", got, err)
	}
	if _, err := parseMeminfo([]byte("MemFree: 1 kB\n")); err == nil {
		t.Fatal("missing MemTotal accepted")
	}
}

func TestHostUsageReadsThisMachine(t *testing.T) {
	u, err := HostUsage()
	if err != nil || u.CPUNanos == 0 || u.MemoryWorkingSet == 0 || u.Time.IsZero() {
		t.Fatalf("%+v %v", u, err)
	}
}
