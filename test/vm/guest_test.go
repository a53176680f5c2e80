package vm

import (
	"context"
	"strings"
	"testing"
)

// The guest is the host the stage is about: systemd as PID 1 on the
// unified hierarchy, with the controllers k3sm limits pods with.
func TestGuestIsCgroupV2UnderSystemd(t *testing.T) {
	need(t)
	out, err := guest.Output(context.Background(), "stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.controllers; readlink /proc/1/exe; systemctl is-system-running --wait")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || lines[0] != "cgroup2fs" || !strings.HasSuffix(lines[2], "/systemd") {
		t.Fatalf("guest: %q", out)
	}
	for _, c := range []string{"memory", "cpu", "pids"} {
		if !strings.Contains(" "+lines[1]+" ", " "+c+" ") {
			t.Errorf("controller %s not in the root's cgroup.controllers: %s", c, lines[1])
		}
	}
	if lines[3] != "running" {
		t.Errorf("systemctl is-system-running: %s", lines[3])
	}
}
