package stats

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
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
	// A loaded machine gives the loop less than its share: poll until it
	// has had 100 ms of CPU instead of sleeping a fixed time.
	var s Sample
	for deadline := time.Now().Add(30 * time.Second); ; {
		time.Sleep(100 * time.Millisecond)
		m, err := ProcessGroups([]int{cmd.Process.Pid})
		if err != nil {
			t.Fatal(err)
		}
		s = m[cmd.Process.Pid]
		if s.CPUNanos >= 100e6 || time.Now().After(deadline) {
			break
		}
	}
	if s.Processes != 1 || s.CPUNanos < 100e6 || s.RSSBytes == 0 {
		t.Fatalf("sample %+v: want one process with >=100ms CPU and some RSS", s)
	}
}
