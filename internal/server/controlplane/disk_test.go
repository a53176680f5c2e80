package controlplane

import (
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
)

func TestDiskConfigDefaultsAndValidation(t *testing.T) {
	c := Defaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if d := c.Disk; d.ContainerLogMaxSize != "10Mi" || d.ContainerLogMaxFiles != 5 || d.ImageGCHighThresholdPercent != 85 ||
		d.ImageGCLowThresholdPercent != 80 || d.ImageMinimumGCAge != 2*time.Minute || d.EvictionPressureTransitionPeriod != 5*time.Minute ||
		d.EvictionHard != "memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%" {
		t.Errorf("kubelet defaults: %+v", d)
	}
	th, err := diskpolicy.ParseEvictionHard("nodefs.available<1Gi, imagefs.available<15%")
	if err != nil || len(th) != 2 || th[0].Value != 1<<30 || th[1].Percent != 15 {
		t.Errorf("parsed %+v %v", th, err)
	}
	for _, tc := range []struct {
		set  func(*diskpolicy.Config)
		flag string
	}{
		{func(d *diskpolicy.Config) { d.ContainerLogMaxSize = "ten" }, "--container-log-max-size"},
		{func(d *diskpolicy.Config) { d.ContainerLogMaxFiles = 1 }, "--container-log-max-files"},
		{func(d *diskpolicy.Config) { d.ImageGCLowThresholdPercent = 90 }, "--image-gc-low-threshold"},
		{func(d *diskpolicy.Config) { d.ImageGCHighThresholdPercent = 101 }, "--image-gc-high-threshold"},
		{func(d *diskpolicy.Config) { d.EvictionHard = "memory.available<lots" }, "--eviction-hard"},
		{func(d *diskpolicy.Config) { d.EvictionHard = "nodefs.available<120%" }, "--eviction-hard"},
		{func(d *diskpolicy.Config) { d.EvictionHard = "memory.available<100Mi,memory.available<1Gi" }, "--eviction-hard"},
		{func(d *diskpolicy.Config) { d.EvictionHard = "memory.available<-1Mi" }, "--eviction-hard"},
	} {
		c := Defaults()
		tc.set(&c.Disk)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("want an error naming %s, got %v", tc.flag, err)
		}
	}
	c = Defaults()
	c.Disk.ContainerLogMaxSize = "0" // rotation off; see the runtime daemon's TestConfigFromRole
	if err := c.Validate(); err != nil {
		t.Errorf("0 turns rotation off: %v", err)
	}
}
