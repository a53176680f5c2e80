package metrics

import (
	"context"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// ResourceMetrics renders one scrape as the kubelet's /metrics/resource
// families (the names and labels metrics-server reads): node, pod and
// container CPU seconds and memory working set, and resource_scrape_error.
func ResourceMetrics(ctx context.Context, src Source) ([]*dto.MetricFamily, error) {
	sm, err := src.Scrape(ctx)
	if err != nil {
		return []*dto.MetricFamily{gaugeFamily("resource_scrape_error", "1 if there was an error while getting container metrics, 0 otherwise",
			&dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(1)}})}, nil
	}
	return ResourceFamilies(sm), nil
}

// ResourceFamilies renders a scrape; see ResourceMetrics.
func ResourceFamilies(sm *Sample) []*dto.MetricFamily {
	ms := func(u Usage) *int64 { return proto.Int64(u.Time.UnixMilli()) }
	secs := func(ns uint64) float64 { return float64(ns) / 1e9 }
	lbl := func(kv ...string) []*dto.LabelPair {
		var out []*dto.LabelPair
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, &dto.LabelPair{Name: proto.String(kv[i]), Value: proto.String(kv[i+1])})
		}
		return out
	}
	node := sm.Node
	var cCPU, cMem, pCPU, pMem []*dto.Metric
	sumCPU, sumMem := uint64(0), uint64(0)
	for _, p := range sm.Pods {
		var cpu, mem uint64
		for _, c := range p.Containers {
			l := lbl("container", c.Name, "namespace", p.Namespace, "pod", p.Name)
			cCPU = append(cCPU, &dto.Metric{Label: l, Counter: &dto.Counter{Value: proto.Float64(secs(c.CPUNanos))}, TimestampMs: ms(c.Usage)})
			cMem = append(cMem, &dto.Metric{Label: l, Gauge: &dto.Gauge{Value: proto.Float64(float64(c.MemoryWorkingSet))}, TimestampMs: ms(c.Usage)})
			cpu += c.CPUNanos
			mem += c.MemoryWorkingSet
		}
		l := lbl("namespace", p.Namespace, "pod", p.Name)
		pCPU = append(pCPU, &dto.Metric{Label: l, Counter: &dto.Counter{Value: proto.Float64(secs(cpu))}, TimestampMs: ms(sm.Node)})
		pMem = append(pMem, &dto.Metric{Label: l, Gauge: &dto.Gauge{Value: proto.Float64(float64(mem))}, TimestampMs: ms(sm.Node)})
		sumCPU += cpu
		sumMem += mem
	}
	if !sm.NodeOK {
		node.CPUNanos, node.MemoryWorkingSet = sumCPU, sumMem
	}
	fams := []*dto.MetricFamily{
		counterFamily("node_cpu_usage_seconds_total", "Cumulative cpu time consumed by the node in core-seconds",
			&dto.Metric{Counter: &dto.Counter{Value: proto.Float64(secs(node.CPUNanos))}, TimestampMs: ms(node)}),
		gaugeFamily("node_memory_working_set_bytes", "Current working set of the node in bytes",
			&dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(float64(node.MemoryWorkingSet))}, TimestampMs: ms(node)}),
	}
	if len(cCPU) > 0 {
		fams = append(fams,
			counterFamily("container_cpu_usage_seconds_total", "Cumulative cpu time consumed by the container in core-seconds", cCPU...),
			gaugeFamily("container_memory_working_set_bytes", "Current working set of the container in bytes", cMem...))
	}
	if len(pCPU) > 0 {
		fams = append(fams,
			counterFamily("pod_cpu_usage_seconds_total", "Cumulative cpu time consumed by the pod in core-seconds", pCPU...),
			gaugeFamily("pod_memory_working_set_bytes", "Current working set of the pod in bytes", pMem...))
	}
	fams = append(fams, gaugeFamily("resource_scrape_error", "1 if there was an error while getting container metrics, 0 otherwise",
		&dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(0)}}))
	return fams
}

func counterFamily(name, help string, ms ...*dto.Metric) *dto.MetricFamily {
	return &dto.MetricFamily{Name: proto.String(name), Help: proto.String(help), Type: dto.MetricType_COUNTER.Enum(), Metric: ms}
}

func gaugeFamily(name, help string, ms ...*dto.Metric) *dto.MetricFamily {
	return &dto.MetricFamily{Name: proto.String(name), Help: proto.String(help), Type: dto.MetricType_GAUGE.Enum(), Metric: ms}
}
