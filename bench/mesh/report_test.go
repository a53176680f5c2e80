//go:build linux

package main

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3, 2, 4}, 3},
		{[]float64{4, 1, 2, 3}, 2.5},
	} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// fakeResult is a run of two rounds with made-up figures.
func fakeResult(status []dataplane.MeshPeerStatus, statusErr error) result {
	node := func(cidr string) *meshNode {
		p := netip.MustParsePrefix(cidr)
		return &meshNode{node: dataplane.Node{CIDR: p, Gateway: p.Addr().Next(), Bridge: "k3sm0", ClusterCIDR: clusterCIDR}}
	}
	r := result{
		o:       options{rounds: 2, duration: 3 * time.Second, chunk: 128 << 10, pings: 2000, mtu: 1380, invocation: "bench/run.sh mesh"},
		m:       machine{Date: "2026-01-01 00:00 UTC", CPUs: 2, CPUModel: "cpu", Kernel: "6.1", Commit: "abc1234", LoadStart: "0.1 0.1 0.1"},
		loadEnd: "0.2 0.2 0.2",
		mesh: &meshCluster{
			nodes: [2]*meshNode{node("100.64.0.0/24"), node("100.64.1.0/24")},
			a1:    dataplane.Pod{IP: netip.MustParseAddr("100.64.0.2")},
			a2:    dataplane.Pod{IP: netip.MustParseAddr("100.64.0.3")},
			b1:    dataplane.Pod{IP: netip.MustParseAddr("100.64.1.2")},
			setup: 80 * time.Millisecond, device: dataplane.MeshDevice,
		},
		bare:       &bareTun{setup: 5 * time.Millisecond},
		status:     status,
		statusErr:  statusErr,
		statusTime: time.Unix(1000, 0),
	}
	us := time.Microsecond
	r.rounds[pathMesh] = []round{{mbps: 180, bytes: 540e6, p50: 100 * us, p99: 200 * us, mss: 1328}, {mbps: 200, bytes: 600e6, p50: 110 * us, p99: 300 * us, mss: 1328}}
	r.rounds[pathBare] = []round{{mbps: 200, bytes: 600e6, p50: 80 * us, p99: 150 * us, mss: 1328}, {mbps: 200, bytes: 600e6, p50: 90 * us, p99: 160 * us, mss: 1328}}
	r.rounds[pathSameNode] = []round{{mbps: 2000, p50: 20 * us, p99: 40 * us, mss: 1448}, {mbps: 2000, p50: 20 * us, p99: 40 * us, mss: 1448}}
	return r
}

func TestRender(t *testing.T) {
	st := []dataplane.MeshPeerStatus{{Endpoint: netip.MustParseAddrPort("10.251.0.2:51820"), LastHandshake: time.Unix(990, 0), TxBytes: 2e9, RxBytes: 1e7}}
	out := render(fakeResult(st, nil))
	for _, want := range []string{
		"| throughput, one TCP stream | 190 MB/s | 200 MB/s | 2000 MB/s | 0.95× | 0.10× |",
		"| 1-byte round trip p50 | 105.0 µs | 85.0 µs | 20.0 µs | 1.24× | 5.25× |",
		"95 % of bare wireguard-go's** 200 MB/s (median of the per-round\n  ratios 95 %; goal ≥ 90 %): met.",
		"+20.0 µs (median of the per-round differences +20.0 µs); for\n  scale",
		"mesh 1328, bare 1328, same node 1448",
		"last handshake 10 s before, 2.00 GB sent and 10.0 MB\n  received",
		"the measured mesh streams alone carried 1.14 GB;",
		"Medians of 2 rounds.",
		"| 2 | 200 MB/s, 110.0 / 300.0 | 200 MB/s, 90.0 / 160.0 | 2000 MB/s, 20.0 / 40.0 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	if out := render(fakeResult(nil, errors.New("boom"))); !strings.Contains(out, "MeshStatus after the rounds failed: boom") {
		t.Errorf("a failed MeshStatus is not reported:\n%s", out)
	}
}
