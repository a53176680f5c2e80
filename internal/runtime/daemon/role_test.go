package daemon

import (
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
)

// The role config's disk policy becomes the daemon's log rotation: the
// kubelet's 10Mi and 5 files, and a size of 0 turns rotation off.
func TestConfigFromRole(t *testing.T) {
	rc := roleconfig.RuntimeConfig{DataDir: "/d", Socket: "/d/run/runtime.sock", MaxPods: 7, Disk: diskpolicy.Default()}
	cfg, err := configFromRole(rc)
	if err != nil || cfg.ContainerLogMaxSize != 10<<20 || cfg.ContainerLogMaxFiles != 5 || cfg.MaxPods != 7 || cfg.DataDir != "/d" || cfg.Socket != rc.Socket {
		t.Fatalf("%+v %v", cfg, err)
	}
	rc.Disk.ContainerLogMaxSize = "0"
	if cfg, err = configFromRole(rc); err != nil || cfg.ContainerLogMaxSize >= 0 {
		t.Fatalf("0 must turn rotation off (a negative size): %+v %v", cfg, err)
	}
	rc.Disk.ContainerLogMaxSize = "ten"
	if _, err = configFromRole(rc); err == nil {
		t.Fatal("a bad size must be refused")
	}
}

// --eviction-hard's memory.available reaches the daemon with the
// housekeeping interval; without it memory is not watched.
func TestConfigFromRoleMemoryThreshold(t *testing.T) {
	rc := roleconfig.RuntimeConfig{DataDir: "/d", Disk: diskpolicy.Default()}
	rc.Disk.HousekeepingInterval = 3 * time.Second
	cfg, err := configFromRole(rc)
	if err != nil || cfg.MemoryThreshold == nil || cfg.MemoryThreshold.Bytes != 100<<20 || cfg.HousekeepingInterval != 3*time.Second {
		t.Fatalf("kubelet default memory.available<100Mi: %+v %v", cfg.MemoryThreshold, err)
	}
	rc.Disk.EvictionHard = "nodefs.available<10%,memory.available<5%"
	if cfg, err = configFromRole(rc); err != nil || cfg.MemoryThreshold == nil || cfg.MemoryThreshold.Percent != 5 {
		t.Fatalf("percentage: %+v %v", cfg.MemoryThreshold, err)
	}
	rc.Disk.EvictionHard = "nodefs.available<10%"
	if cfg, err = configFromRole(rc); err != nil || cfg.MemoryThreshold != nil {
		t.Fatalf("no memory signal: %+v %v", cfg.MemoryThreshold, err)
	}
	rc.Disk.EvictionHard = "memory.available<much"
	if _, err = configFromRole(rc); err == nil || !strings.Contains(err.Error(), "--eviction-hard") {
		t.Fatalf("bad threshold: %v", err)
	}
}
