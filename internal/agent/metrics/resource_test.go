package metrics

import (
	"context"
	"errors"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

type sourceFunc func(context.Context) (*Sample, error)

func (f sourceFunc) Scrape(ctx context.Context) (*Sample, error) { return f(ctx) }

func family(fams []*dto.MetricFamily, name string) *dto.MetricFamily {
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	return nil
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func TestResourceFamilies(t *testing.T) {
	sm := &Sample{NodeOK: true, Node: Usage{Time: at(0), CPUNanos: 90e9, MemoryWorkingSet: 1 << 30},
		Pods: []PodSample{pod("a", ctr("web", 0, 3e9), ctr("log", 0, 1e9))}}
	fams, err := ResourceMetrics(context.Background(), sourceFunc(func(context.Context) (*Sample, error) { return sm, nil }))
	if err != nil {
		t.Fatal(err)
	}
	if f := family(fams, "node_cpu_usage_seconds_total"); f == nil || f.GetType() != dto.MetricType_COUNTER || f.Metric[0].GetCounter().GetValue() != 90 ||
		f.Metric[0].GetTimestampMs() != at(0).UnixMilli() {
		t.Errorf("node cpu: %v", f)
	}
	if f := family(fams, "node_memory_working_set_bytes"); f == nil || f.Metric[0].GetGauge().GetValue() != 1<<30 {
		t.Errorf("node memory: %v", f)
	}
	f := family(fams, "container_cpu_usage_seconds_total")
	if f == nil || len(f.Metric) != 2 || f.Metric[0].GetCounter().GetValue() != 3 {
		t.Fatalf("container cpu: %v", f)
	}
	if l := labelsOf(f.Metric[0]); l["container"] != "web" || l["pod"] != "a" || l["namespace"] != "ns" {
		t.Errorf("container labels: %v", l)
	}
	if f := family(fams, "pod_cpu_usage_seconds_total"); f == nil || f.Metric[0].GetCounter().GetValue() != 4 {
		t.Errorf("pod cpu: %v", f)
	}
	if f := family(fams, "pod_memory_working_set_bytes"); f == nil || f.Metric[0].GetGauge().GetValue() != 4e8 {
		t.Errorf("pod memory: %v", f)
	}
	if f := family(fams, "resource_scrape_error"); f == nil || f.Metric[0].GetGauge().GetValue() != 0 {
		t.Errorf("scrape error: %v", f)
	}

	fams, err = ResourceMetrics(context.Background(), sourceFunc(func(context.Context) (*Sample, error) { return nil, errors.New("runtime down") }))
	if err != nil || len(fams) != 1 || fams[0].GetName() != "resource_scrape_error" || fams[0].Metric[0].GetGauge().GetValue() != 1 {
		t.Errorf("failed scrape: %v %v", fams, err)
	}
}
