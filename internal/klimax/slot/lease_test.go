package slot

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLeaseHelperProcess is not a test: run by TestClaimAcrossProcesses as
// a separate klimax-like process that claims a slot, prints it, and holds
// the claim until its stdin closes.
func TestLeaseHelperProcess(t *testing.T) {
	dir := os.Getenv("KLIMAX_LEASE_DIR")
	if dir == "" {
		t.Skip("helper process")
	}
	ls := &Leases{Dir: dir}
	l, _, err := ls.Claim(context.Background(), ClaimOptions{Cluster: "p" + strconv.Itoa(os.Getpid()), Used: []Slot{1}})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("slot", int(l.Slot))
	io.Copy(io.Discard, os.Stdin)
	l.Release()
	os.Exit(0)
}

// Eight klimax processes started at once each get a different slot (before,
// each computed "lowest free" on its own and they all took slot 2).
func TestClaimAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	var wg sync.WaitGroup
	slots := make(chan string, n)
	var closers []io.Closer
	var cmds []*exec.Cmd
	for i := 0; i < n; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseHelperProcess$")
		cmd.Env = append(os.Environ(), "KLIMAX_LEASE_DIR="+dir)
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		closers, cmds = append(closers, in), append(cmds, cmd)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if l := sc.Text(); strings.HasPrefix(l, "slot ") || strings.HasPrefix(l, "error ") {
					slots <- l
					return
				}
			}
			slots <- "no output"
		}()
	}
	wg.Wait()
	close(slots)
	seen := map[string]bool{}
	for s := range slots {
		if !strings.HasPrefix(s, "slot ") || seen[s] || s == "slot 1" {
			t.Errorf("process got %q (seen %v)", s, seen)
		}
		seen[s] = true
	}
	for i, c := range closers {
		c.Close()
		cmds[i].Wait()
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(left) != 0 {
		t.Errorf("claims left after release: %v", left)
	}
}

func TestClaimConcurrentGoroutines(t *testing.T) {
	ls := &Leases{Dir: t.TempDir()}
	var mu sync.Mutex
	got := map[Slot]int{}
	var wg sync.WaitGroup
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			l, _, err := ls.Claim(context.Background(), ClaimOptions{Cluster: fmt.Sprint("c", i)})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got[l.Slot]++
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	if len(got) != 30 {
		t.Errorf("30 claims got %d distinct slots: %v", len(got), got)
	}
}

func TestClaimStaleAndReleased(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ls := &Leases{Dir: dir, now: func() time.Time { return now }, alive: func(pid int) bool { return pid != 999999 }}
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "1.json"), []byte(`{"cluster":"dead","pid":999999,"since":"2026-01-01T11:59:00Z"}`), 0o600)
	os.WriteFile(filepath.Join(dir, "2.json"), []byte(`{"cluster":"old","pid":1,"since":"2026-01-01T10:00:00Z"}`), 0o600)
	os.WriteFile(filepath.Join(dir, "3.json"), []byte(`{"cluster":"busy","pid":1,"since":"2026-01-01T11:59:00Z"}`), 0o600)
	os.WriteFile(filepath.Join(dir, "4.json"), []byte(`garbage`), 0o600)
	l, _, err := ls.Claim(context.Background(), ClaimOptions{Cluster: "a"})
	if err != nil || l.Slot != 1 {
		t.Fatalf("claim over a dead process's lease: %v %v", l, err)
	}
	l2, _, _ := ls.Claim(context.Background(), ClaimOptions{Cluster: "b"})
	if l2.Slot != 2 {
		t.Errorf("lease older than LeaseMaxAge still counted: got %d", l2.Slot)
	}
	l3, _, _ := ls.Claim(context.Background(), ClaimOptions{Cluster: "c"})
	if l3.Slot != 4 {
		t.Errorf("live lease of slot 3 not respected / garbage not dropped: got %d", l3.Slot)
	}
	if _, _, err := ls.Claim(context.Background(), ClaimOptions{Cluster: "d", Slot: 3}); err == nil || !strings.Contains(err.Error(), "being created by cluster busy") {
		t.Errorf("pinned leased slot: %v", err)
	}
	if _, _, err := ls.Claim(context.Background(), ClaimOptions{Cluster: "busy"}); err == nil || !strings.Contains(err.Error(), "cluster busy is being created by another klimax command") {
		t.Errorf("same cluster name claimed twice: %v", err)
	}
	l.Release()
	l.Release()
	l4, _, _ := ls.Claim(context.Background(), ClaimOptions{Cluster: "e"})
	if l4.Slot != 1 {
		t.Errorf("released slot not reused: %d", l4.Slot)
	}
}

func TestClaimSkipsPortsInUse(t *testing.T) {
	busy := func(ctx context.Context, port int) error {
		if port == 7001 || port == 7003 {
			return errors.New("address already in use")
		}
		return nil
	}
	ls := &Leases{Dir: t.TempDir()}
	ctx := context.Background()
	l, skipped, err := ls.Claim(ctx, ClaimOptions{Cluster: "a", PortFree: busy})
	if err != nil || l.Slot != 2 || len(skipped) != 1 || skipped[0] != "port 7001" {
		t.Fatalf("auto: %v %v %v", l, skipped, err)
	}
	_, _, err = ls.Claim(ctx, ClaimOptions{Cluster: "b", Slot: 3, PortFree: busy})
	if err == nil || !strings.Contains(err.Error(), "API port 7003 is in use") || !strings.Contains(err.Error(), "fix:") {
		t.Errorf("pinned slot with a busy port: %v", err)
	}
	l, _, err = ls.Claim(ctx, ClaimOptions{Cluster: "c", Slot: 3, Hint: true, PortFree: busy})
	if err != nil || l.Slot != 4 {
		t.Errorf("hinted slot with a busy port: %v %v", l, err)
	}
	all := func(ctx context.Context, port int) error { return errors.New("in use") }
	if _, _, err := (&Leases{Dir: t.TempDir()}).Claim(ctx, ClaimOptions{Cluster: "d", PortFree: all}); err == nil || !strings.Contains(err.Error(), "no free slot") {
		t.Errorf("all ports busy: %v", err)
	}
	// No lease dir: same choice, nothing recorded.
	var none *Leases
	if l, _, err := none.Claim(ctx, ClaimOptions{Used: []Slot{1}}); err != nil || l.Slot != 2 || l.Release() != nil {
		t.Errorf("nil leases: %v %v", l, err)
	}
}
