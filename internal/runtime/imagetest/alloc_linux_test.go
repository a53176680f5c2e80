package imagetest

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// alloc makes the memory resident: the process's RSS grows by about the
// size, and a bad size is refused.
func TestProgAlloc(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the test program")
	}
	bin, err := BuildProg(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pidFile := t.TempDir() + "/pid"
	cmd := exec.Command(bin, "alloc:64Mi", "pid:"+pidFile, "forever")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var rssKB int
	for range 100 {
		if _, err := os.Stat(pidFile); err == nil {
			status, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/status")
			for _, l := range strings.Split(string(status), "\n") {
				if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
					rssKB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
				}
			}
			break
		}
		exec.Command("sleep", "0.05").Run()
	}
	if rssKB < 64<<10 {
		t.Errorf("RSS %d kB after alloc:64Mi", rssKB)
	}
	if out, err := exec.Command(bin, "alloc:lots").CombinedOutput(); err == nil || !strings.Contains(string(out), `size "lots"`) {
		t.Errorf("bad size: %q %v", out, err)
	}
}
