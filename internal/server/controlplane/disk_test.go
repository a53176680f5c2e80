package controlplane

import (
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
)

func TestDiskConfigDefaultsAndValidation(t *testing.T) {
	c := Defaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Disk.RuntimeArgs(), " "); got != "--container-log-max-size=10485760 --container-log-max-files=5" {
		t.Errorf("runtime args %q", got)
	}
	args := strings.Join(c.Disk.NodeArgs(), " ")
	for _, want := range []string{"--image-gc-high-threshold=85", "--image-gc-low-threshold=80", "--image-minimum-gc-age=2m0s",
		"--eviction-hard=nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%", "--eviction-pressure-transition-period=5m0s"} {
		if !strings.Contains(args, want) {
			t.Errorf("node args %q lack %q", args, want)
		}
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
		{func(d *diskpolicy.Config) { d.EvictionHard = "memory.available<100Mi" }, "--eviction-hard"},
		{func(d *diskpolicy.Config) { d.EvictionHard = "nodefs.available<120%" }, "--eviction-hard"},
	} {
		c := Defaults()
		tc.set(&c.Disk)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("want an error naming %s, got %v", tc.flag, err)
		}
	}
	c = Defaults()
	c.Disk.ContainerLogMaxSize = "0"
	if err := c.Validate(); err != nil || c.Disk.RuntimeArgs()[0] != "--container-log-max-size=-1" {
		t.Errorf("0 turns rotation off: %v %v", err, c.Disk.RuntimeArgs())
	}
}
