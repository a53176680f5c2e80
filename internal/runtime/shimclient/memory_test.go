package shimclient

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/shim"
)

// smapsRollup returns Rss and Pss (kB) of pid.
func smapsRollup(pid int) (rss, pss int, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		v, _ := strconv.Atoi(fs[1])
		switch fs[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		}
	}
	return rss, pss, sc.Err()
}

// TestIntegrationShimMemory measures idle shims: RSS and PSS of one shim
// alone, then the average PSS with 20 shims sharing their text pages.
func TestIntegrationShimMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	s, dir := newStarter(t)
	ctx := context.Background()
	const n = 20
	var pids []int
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("m%d", i)
		p, err := s.Start(ctx, spec(dir, id, "/bin/sleep", "1000"))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Signal(syscall.SIGKILL)
		var st shim.Response
		b, _ := os.ReadFile(filepath.Join(dir, "state", id, shim.PidFile))
		json.Unmarshal(b, &st)
		pids = append(pids, st.ShimPid)
		if i == 0 {
			time.Sleep(time.Second)
			rss, pss, err := smapsRollup(st.ShimPid)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("one idle shim: RSS %d kB, PSS %d kB", rss, pss)
		}
	}
	time.Sleep(time.Second)
	var rssSum, pssSum int
	for _, pid := range pids {
		rss, pss, err := smapsRollup(pid)
		if err != nil {
			t.Fatal(err)
		}
		rssSum += rss
		pssSum += pss
	}
	t.Logf("%d idle shims: mean RSS %d kB, mean PSS %d kB", n, rssSum/n, pssSum/n)
	if pssSum/n > 4096 {
		t.Errorf("mean shim PSS %d kB is over 4 MiB", pssSum/n)
	}
}
