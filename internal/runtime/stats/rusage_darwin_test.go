package stats

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestProcessRusage reads a real process: its own CPU time, checked against
// getrusage, grows with work; its footprint with memory it touches.
func TestProcessRusage(t *testing.T) {
	fp0, cpu0, err := ProcessRusage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if fp0 == 0 {
		t.Error("footprint 0 for a running process")
	}
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); { // burns 200 ms of CPU: no wait
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	fp1, cpu1, err := ProcessRusage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if fp1 < fp0+32<<20 {
		t.Errorf("footprint %d → %d after touching 64 MiB", fp0, fp1)
	}
	if cpu1 < cpu0+150*uint64(time.Millisecond) {
		t.Errorf("CPU %v → %v after a 200 ms busy loop", time.Duration(cpu0), time.Duration(cpu1))
	}
	// getrusage counts in µs: the tick conversion must agree with it.
	want := uint64(ru.Utime.Nano() + ru.Stime.Nano())
	if d := int64(cpu1) - int64(want); d < -int64(50*time.Millisecond) || d > int64(50*time.Millisecond) {
		t.Errorf("proc_pid_rusage CPU %v, getrusage %v", time.Duration(cpu1), time.Duration(want))
	}
	_ = buf[len(buf)-1]

	// A child of ours, then gone.
	cmd := exec.Command("/bin/sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if fp, _, err := ProcessRusage(cmd.Process.Pid); err != nil || fp == 0 {
		t.Errorf("child: %d, %v", fp, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, _, err := ProcessRusage(cmd.Process.Pid); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("reaped child: %v, want ESRCH", err)
	}
	if _, _, err := ProcessRusage(0); err == nil {
		t.Error("pid 0 accepted")
	}
}
