package stats

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

func TestProcessGroupsBusyLoop(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
	// A loaded machine gives the loop less than its share: poll (every
	// 100 ms, each a walk of /proc) until it has had 100 ms of CPU instead
	// of sleeping a fixed time.
	var s Sample
	poll.Every(t, context.Background(), 30*time.Second, 100*time.Millisecond, "100 ms of CPU for the loop", func() error {
		m, err := ProcessGroups([]int{cmd.Process.Pid})
		if err != nil {
			t.Fatal(err)
		}
		if s = m[cmd.Process.Pid]; s.CPUNanos < 100e6 {
			return fmt.Errorf("sample %+v", s)
		}
		return nil
	})
	if s.Processes != 1 || s.CPUNanos < 100e6 || s.RSSBytes == 0 {
		t.Fatalf("sample %+v: want one process with >=100ms CPU and some RSS", s)
	}
}
