// Package diskpolicy owns the kubelet's housekeeping settings with their
// defaults and validation: container log rotation (done by the runtime
// daemon's shims), image garbage collection and the DiskPressure thresholds
// (done by the node), and the memory.available threshold (MemoryPressure on
// the node, evictions in the runtime daemon). The server sets them from its
// flags and passes them to the node and the runtime daemon; both sides
// import this package, neither imports the other's.
package diskpolicy

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Config is how the node keeps its disk in check, with the kubelet's
// defaults.
type Config struct {
	// ContainerLogMaxSize (a quantity, "10Mi") and ContainerLogMaxFiles:
	// the kubelet's containerLogMaxSize / containerLogMaxFiles.
	ContainerLogMaxSize  string
	ContainerLogMaxFiles int
	// Image GC: above High percent of the image filesystem in use, unused
	// images are removed, least recently used first, until usage is below
	// Low; never an image younger than MinimumAge (imageGCHighThreshold-
	// Percent 85, imageGCLowThresholdPercent 80, imageMinimumGCAge 2m).
	// GCPeriod is how often it runs (the kubelet's 5 m).
	ImageGCHighThresholdPercent int
	ImageGCLowThresholdPercent  int
	ImageMinimumGCAge           time.Duration
	ImageGCPeriod               time.Duration
	// EvictionHard is the kubelet's --eviction-hard: the disk signals
	// (nodefs.available, nodefs.inodesFree, imagefs.available,
	// imagefs.inodesFree) make DiskPressure True while one is below its
	// threshold; memory.available makes MemoryPressure True and the runtime
	// evict pods. A condition stays True for
	// EvictionPressureTransitionPeriod after the last crossing. As with the
	// kubelet, the flag replaces the whole default list: a signal left out
	// is not watched.
	EvictionHard                     string
	EvictionPressureTransitionPeriod time.Duration
	// HousekeepingInterval is how often disk and memory are measured
	// (10 s, the kubelet's eviction monitoring period).
	HousekeepingInterval time.Duration
}

// Default is the kubelet's defaults.
func Default() Config {
	return Config{
		ContainerLogMaxSize: "10Mi", ContainerLogMaxFiles: 5,
		ImageGCHighThresholdPercent: 85, ImageGCLowThresholdPercent: 80, ImageMinimumGCAge: 2 * time.Minute, ImageGCPeriod: 5 * time.Minute,
		EvictionHard:                     "memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%",
		EvictionPressureTransitionPeriod: 5 * time.Minute,
		HousekeepingInterval:             10 * time.Second,
	}
}

// ContainerLogMaxBytes is ContainerLogMaxSize in bytes.
func (d Config) ContainerLogMaxBytes() (int64, error) {
	q, err := resource.ParseQuantity(d.ContainerLogMaxSize)
	if err != nil {
		return 0, err
	}
	return q.Value(), nil
}

// Threshold is one signal of EvictionHard: a percentage (0-100) or an
// absolute quantity in bytes/inodes.
type Threshold struct {
	Signal  string
	Percent float64 // when set
	Value   int64   // when Percent is 0
}

// MemoryAvailable is the kubelet's memory signal.
const MemoryAvailable = "memory.available"

// ParseEvictionHard parses "signal<quantity|percent%,...".
func ParseEvictionHard(s string) ([]Threshold, error) {
	var out []Threshold
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		sig, val, ok := strings.Cut(part, "<")
		if !ok {
			return nil, fmt.Errorf("%q: want signal<value, e.g. nodefs.available<10%%", part)
		}
		switch sig {
		case MemoryAvailable, "nodefs.available", "nodefs.inodesFree", "imagefs.available", "imagefs.inodesFree":
		default:
			return nil, fmt.Errorf("%q: unknown signal %q (k3sm watches memory.available, nodefs.available, nodefs.inodesFree, imagefs.available, imagefs.inodesFree)", part, sig)
		}
		if seen[sig] {
			return nil, fmt.Errorf("%q: %s is given twice", part, sig)
		}
		seen[sig] = true
		t := Threshold{Signal: sig}
		if p, ok := strings.CutSuffix(val, "%"); ok {
			f, err := strconv.ParseFloat(p, 64)
			if err != nil || f <= 0 || f > 100 {
				return nil, fmt.Errorf("%q: percentage must be in (0, 100]", part)
			}
			t.Percent = f
		} else {
			q, err := resource.ParseQuantity(val)
			if err != nil {
				return nil, fmt.Errorf("%q: %v", part, err)
			}
			if q.Sign() <= 0 {
				return nil, fmt.Errorf("%q: the quantity must be positive", part)
			}
			t.Value = q.Value()
		}
		out = append(out, t)
	}
	return out, nil
}

// Validate reports each bad setting through add, named by its server flag,
// and fills in the hidden periods left at zero.
func (d *Config) Validate(add func(flag, value, problem, fix string)) {
	if n, err := d.ContainerLogMaxBytes(); err != nil || n < 0 {
		add("container-log-max-size", d.ContainerLogMaxSize, "not a size", "use a quantity such as 10Mi (0 turns rotation off)")
	}
	if d.ContainerLogMaxFiles < 2 {
		add("container-log-max-files", fmt.Sprint(d.ContainerLogMaxFiles), "must be at least 2", "use e.g. 5 (the live file and 4 rotated ones)")
	}
	h, l := d.ImageGCHighThresholdPercent, d.ImageGCLowThresholdPercent
	if h < 0 || h > 100 {
		add("image-gc-high-threshold", fmt.Sprint(h), "must be a percentage from 0 to 100", "use e.g. 85 (100 turns image GC off)")
	}
	if l < 0 || l > 100 || l > h {
		add("image-gc-low-threshold", fmt.Sprint(l), "must be a percentage from 0 to --image-gc-high-threshold", "use e.g. 80")
	}
	if d.ImageMinimumGCAge < 0 {
		add("image-minimum-gc-age", d.ImageMinimumGCAge.String(), "must not be negative", "use e.g. 2m")
	}
	if _, err := ParseEvictionHard(d.EvictionHard); err != nil {
		add("eviction-hard", d.EvictionHard, err.Error(), "use signal<quantity or signal<percent%, comma-separated, e.g. memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%")
	}
	if d.ImageGCPeriod <= 0 {
		d.ImageGCPeriod = 5 * time.Minute
	}
	if d.HousekeepingInterval <= 0 {
		d.HousekeepingInterval = 10 * time.Second
	}
}
