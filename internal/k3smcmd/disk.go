package k3smcmd

import (
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/spf13/pflag"
)

// addDiskFlags: the kubelet's log rotation, image GC and eviction
// settings, with its defaults.
func addDiskFlags(f *pflag.FlagSet, d *diskpolicy.Config) {
	f.StringVar(&d.ContainerLogMaxSize, "container-log-max-size", d.ContainerLogMaxSize, "rotate a container's log when it reaches this size (the kubelet's containerLogMaxSize; 0: never)")
	f.IntVar(&d.ContainerLogMaxFiles, "container-log-max-files", d.ContainerLogMaxFiles, "log files kept per container, the live one included (the kubelet's containerLogMaxFiles)")
	f.IntVar(&d.ImageGCHighThresholdPercent, "image-gc-high-threshold", d.ImageGCHighThresholdPercent, "percent of the image filesystem in use above which unused images are removed")
	f.IntVar(&d.ImageGCLowThresholdPercent, "image-gc-low-threshold", d.ImageGCLowThresholdPercent, "percent of the image filesystem in use image GC frees down to")
	f.DurationVar(&d.ImageMinimumGCAge, "image-minimum-gc-age", d.ImageMinimumGCAge, "an unused image is not removed before it was known this long (the kubelet's imageMinimumGCAge)")
	f.StringVar(&d.EvictionHard, "eviction-hard", d.EvictionHard, "the kubelet's hard eviction thresholds, signal<quantity or signal<percent%: memory.available (MemoryPressure, pods evicted), nodefs/imagefs (DiskPressure); replaces the whole list")
	f.DurationVar(&d.EvictionPressureTransitionPeriod, "eviction-pressure-transition-period", d.EvictionPressureTransitionPeriod, "how long MemoryPressure/DiskPressure stay True after the last threshold crossing")
	f.DurationVar(&d.ImageGCPeriod, "image-gc-period", d.ImageGCPeriod, "how often image GC runs")
	f.DurationVar(&d.HousekeepingInterval, "housekeeping-interval", d.HousekeepingInterval, "how often the node measures its disk and memory (the eviction check)")
	_ = f.MarkHidden("image-gc-period")
	_ = f.MarkHidden("housekeeping-interval")
}
