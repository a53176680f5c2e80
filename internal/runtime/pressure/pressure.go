// Package pressure is the kubelet's eviction manager for the memory signal:
// memory.available (on Linux the machine's memory less the root cgroup's
// working set, as the kubelet computes it) against the hard threshold, and under pressure the eviction of one pod per check, ranked
// as the kubelet ranks them (rank.go). The runtime daemon runs it with its
// pods' usage; the node reads the same signal for its MemoryPressure
// condition.
package pressure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
)

// Memory is the node's memory as the eviction signal sees it.
type Memory struct {
	AvailableBytes uint64
	TotalBytes     uint64
	// Source says how AvailableBytes was computed (logged once at start).
	Source string
}

// ErrUnsupported is returned where the memory signal cannot be read.
var ErrUnsupported = errors.New("pressure: memory.available is not measured on this platform")

// ReadMemory reads the node's available and total memory.
func ReadMemory() (Memory, error) { return readMemory() }

// Threshold is a memory.available hard threshold: Bytes, or Percent of
// the node's total memory.
type Threshold struct {
	Bytes   int64
	Percent float64
}

// FromPolicy is the memory.available threshold of an --eviction-hard list;
// ok is false when it has none.
func FromPolicy(evictionHard string) (t Threshold, ok bool, err error) {
	ths, err := diskpolicy.ParseEvictionHard(evictionHard)
	if err != nil {
		return Threshold{}, false, err
	}
	t, ok = FromThresholds(ths)
	return t, ok, nil
}

// FromThresholds is the memory.available threshold of a parsed
// --eviction-hard list; ok is false when it has none (memory is then not
// watched).
func FromThresholds(ths []diskpolicy.Threshold) (t Threshold, ok bool) {
	for _, th := range ths {
		if th.Signal == diskpolicy.MemoryAvailable {
			return Threshold{Bytes: th.Value, Percent: th.Percent}, true
		}
	}
	return Threshold{}, false
}

// Quantity is the threshold in bytes for a node with total bytes, as the
// kubelet's GetThresholdQuantity computes a percentage.
func (t Threshold) Quantity(total uint64) int64 {
	if t.Percent > 0 {
		return int64(float64(total) * t.Percent / 100)
	}
	return t.Bytes
}

// Observation is one measurement against the threshold.
type Observation struct {
	Memory
	ThresholdBytes int64
}

// Met reports that available memory is below the threshold.
func (o Observation) Met() bool { return int64(o.AvailableBytes) < o.ThresholdBytes }

// Observe measures memory with read against t.
func Observe(read func() (Memory, error), t Threshold) (Observation, error) {
	m, err := read()
	if err != nil {
		return Observation{}, err
	}
	return Observation{Memory: m, ThresholdBytes: t.Quantity(m.TotalBytes)}, nil
}

// Config is what the eviction loop needs.
type Config struct {
	Threshold Threshold
	// Interval between checks (10 s, the kubelet's housekeeping).
	Interval time.Duration
	// Read measures memory (ReadMemory when nil).
	Read func() (Memory, error)
	// Pods lists the node's pods with their usage; terminal, terminating
	// and already evicted pods are left out by the caller.
	Pods func(ctx context.Context) ([]Pod, error)
	// Evict stops the pod with the kubelet's Evicted status and message.
	Evict func(p Pod, message string) error
	Log   *slog.Logger
}

// Run checks every Interval until ctx ends.
func Run(ctx context.Context, cfg Config) {
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	wasMet := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		obs, _, err := Check(ctx, cfg)
		if err != nil {
			cfg.logger().Warn("memory eviction check", "err", err)
			continue
		}
		if met := obs.Met(); met != wasMet {
			wasMet = met
			if met {
				cfg.logger().Warn("memory eviction threshold met", "available", obs.AvailableBytes, "threshold", obs.ThresholdBytes)
			} else {
				cfg.logger().Info("memory eviction threshold no longer met", "available", obs.AvailableBytes, "threshold", obs.ThresholdBytes)
			}
		}
	}
}

func (cfg Config) logger() *slog.Logger {
	if cfg.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return cfg.Log
}

// Check is one housekeeping pass: it measures memory and, when the
// threshold is met, evicts the first pod of the kubelet's ranking that may
// be evicted (never a critical one). It returns the observation and the
// pod evicted, if any.
func Check(ctx context.Context, cfg Config) (Observation, *Pod, error) {
	read := cfg.Read
	if read == nil {
		read = ReadMemory
	}
	obs, err := Observe(read, cfg.Threshold)
	if err != nil || !obs.Met() {
		return obs, nil, err
	}
	pods, err := cfg.Pods(ctx)
	if err != nil {
		return obs, nil, fmt.Errorf("list pods: %w", err)
	}
	Rank(pods)
	for i := range pods {
		p := &pods[i]
		if p.Critical {
			// As the kubelet: a static, mirror or system-critical pod is
			// never evicted; the next one in the ranking is.
			cfg.logger().Warn("eviction manager: cannot evict a critical pod", "pod", p.Namespace+"/"+p.Name)
			continue
		}
		msg := Message(obs, *p)
		cfg.logger().Info("eviction manager: evicting pod to reclaim memory", "pod", p.Namespace+"/"+p.Name,
			"usage", p.UsageBytes, "request", p.RequestBytes, "priority", p.Priority)
		if err := cfg.Evict(*p, msg); err != nil {
			cfg.logger().Warn("eviction manager: evict", "pod", p.Namespace+"/"+p.Name, "err", err)
			continue
		}
		return obs, p, nil
	}
	if len(pods) > 0 {
		cfg.logger().Warn("eviction manager: unable to evict any pods from the node")
	}
	return obs, nil, nil
}
