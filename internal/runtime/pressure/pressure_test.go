package pressure

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestThresholdFromPolicy(t *testing.T) {
	for _, tc := range []struct {
		in      string
		ok      bool
		bytes   int64
		percent float64
		wantErr bool
	}{
		{"memory.available<100Mi", true, 100 << 20, 0, false},
		{"nodefs.available<10%,memory.available<5%", true, 0, 5, false},
		{"memory.available<1.5Gi", true, 3 << 29, 0, false},
		{"nodefs.available<10%", false, 0, 0, false},
		{"memory.available<100MB", false, 0, 0, true},
		{"memory.available<0", false, 0, 0, true},
		{"memory.available<120%", false, 0, 0, true},
		{"memory.available>100Mi", false, 0, 0, true},
		{"memory.available<1Mi,memory.available<2Mi", false, 0, 0, true},
	} {
		th, ok, err := FromPolicy(tc.in)
		if (err != nil) != tc.wantErr || ok != tc.ok || th.Bytes != tc.bytes || th.Percent != tc.percent {
			t.Errorf("FromPolicy(%q) = %+v %v %v", tc.in, th, ok, err)
		}
	}
	if q := (Threshold{Percent: 10}).Quantity(8 << 30); q != 858993459 {
		t.Errorf("10%% of 8Gi: %d", q)
	}
}

// One check evicts one pod, the first of the ranking that is not
// critical, and only while the threshold is met.
func TestCheckEvictsOnePodPerCheck(t *testing.T) {
	avail := uint64(50 << 20)
	read := func() (Memory, error) { return Memory{AvailableBytes: avail, TotalBytes: 4 << 30}, nil }
	live := []Pod{
		{Name: "critical-hog", Critical: true, Priority: SystemCriticalPriority, UsageBytes: 900 * mi, HasStats: true},
		{Name: "guaranteed", RequestBytes: 64 * mi, UsageBytes: 8 * mi, HasStats: true,
			Containers: []Container{{Name: "c", RequestBytes: 64 * mi, UsageBytes: 8 * mi, HasUsage: true}}},
		{Name: "hog", UsageBytes: 300 * mi, HasStats: true, Containers: []Container{{Name: "c", UsageBytes: 300 * mi, HasUsage: true}}},
	}
	var evicted []string
	var messages []string
	cfg := Config{Threshold: Threshold{Bytes: 100 * mi}, Read: read,
		Pods: func(context.Context) ([]Pod, error) { return append([]Pod(nil), live...), nil },
		Evict: func(p Pod, msg string) error {
			evicted, messages = append(evicted, p.Name), append(messages, msg)
			for i := range live {
				if live[i].Name == p.Name {
					live = append(live[:i], live[i+1:]...)
					break
				}
			}
			return nil
		}}
	obs, p, err := Check(context.Background(), cfg)
	if err != nil || !obs.Met() || p == nil || p.Name != "hog" {
		t.Fatalf("first check: %+v %+v %v", obs, p, err)
	}
	want := "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container c was using 300Mi, request is 0, has larger consumption of memory. "
	if messages[0] != want {
		t.Errorf("message %q", messages[0])
	}
	if _, p, _ := Check(context.Background(), cfg); p == nil || p.Name != "guaranteed" {
		t.Fatalf("second check evicted %+v", p)
	}
	// Only the critical pod is left: it stays.
	if _, p, _ := Check(context.Background(), cfg); p != nil {
		t.Fatalf("third check evicted %+v", p)
	}
	// Enough memory: nothing is listed or evicted.
	avail = 200 << 20
	cfg.Pods = func(context.Context) ([]Pod, error) { t.Error("pods listed without pressure"); return nil, nil }
	if obs, p, err := Check(context.Background(), cfg); obs.Met() || p != nil || err != nil {
		t.Errorf("no pressure: %+v %+v %v", obs, p, err)
	}
	if len(evicted) != 2 {
		t.Errorf("evicted %v", evicted)
	}
}

// A failed eviction moves on to the next pod in the same check.
func TestCheckSkipsAPodThatCannotBeEvicted(t *testing.T) {
	cfg := Config{Threshold: Threshold{Percent: 50},
		Read: func() (Memory, error) { return Memory{AvailableBytes: 1 << 30, TotalBytes: 4 << 30}, nil },
		Pods: func(context.Context) ([]Pod, error) {
			return []Pod{{Name: "gone", UsageBytes: 9 * mi, HasStats: true}, {Name: "next", UsageBytes: 1 * mi, HasStats: true}}, nil
		},
		Evict: func(p Pod, _ string) error {
			if p.Name == "gone" {
				return errors.New("not found")
			}
			return nil
		}}
	if _, p, err := Check(context.Background(), cfg); err != nil || p == nil || p.Name != "next" {
		t.Errorf("evicted %+v %v", p, err)
	}
}

func TestRunChecksEveryInterval(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reads := make(chan time.Time, 10)
	cfg := Config{Threshold: Threshold{Bytes: 1}, Interval: 50 * time.Millisecond,
		Read: func() (Memory, error) {
			reads <- time.Now()
			return Memory{AvailableBytes: 1 << 30, TotalBytes: 2 << 30}, nil
		}}
	go Run(ctx, cfg)
	start := time.Now()
	for range 3 {
		select {
		case <-reads:
		case <-time.After(5 * time.Second):
			t.Fatal("no check within 5s")
		}
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("3 checks in %s with a 50ms interval", d)
	}
}

func TestDarwinMemory(t *testing.T) {
	m := darwinMemory(8<<30, 16384, [4]uint32{1000, 200, 50, 30000})
	if m.AvailableBytes != 31250*16384 || m.TotalBytes != 8<<30 {
		t.Errorf("%+v", m)
	}
	if m := darwinMemory(1<<20, 16384, [4]uint32{1000, 0, 0, 0}); m.AvailableBytes != 1<<20 {
		t.Errorf("not capped at total: %+v", m)
	}
}
