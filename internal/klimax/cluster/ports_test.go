package cluster_test

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// A slot whose API port another program holds on the host: kind (here the
// fake, which publishes on 127.0.0.1 like Docker) would fail; klimax skips
// the slot with a warning, and refuses it when pinned, naming the port.
func TestCreateSkipsSlotWhosePortIsTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:7001")
	if err != nil {
		t.Skipf("127.0.0.1:7001 is not free here: %v", err)
	}
	defer l.Close()
	e := newEnv(t)
	e.M.ListenAddress = "127.0.0.1"
	e.M.APIHost = func(context.Context) (string, error) { return "127.0.0.1", nil }
	ctx := context.Background()
	// Without the check (as before) the create fails inside kind.
	if _, err := e.M.Create(ctx, cluster.CreateOptions{Name: "dev"}); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("fake kind with a taken port: %v", err)
	}
	var warn bytes.Buffer
	e.M.Warn = &warn
	e.M.PortFree = cluster.LocalPortCheck("127.0.0.1")
	info, err := e.M.Create(ctx, cluster.CreateOptions{Name: "dev"})
	if err != nil || info.Slot != 2 {
		t.Fatalf("create: %+v %v", info, err)
	}
	if !strings.Contains(warn.String(), "port 7001") || !strings.Contains(warn.String(), "using slot 2") {
		t.Errorf("warning: %q", warn.String())
	}
	_, err = e.M.Create(ctx, cluster.CreateOptions{Name: "pinned", Slot: 1})
	if err == nil || !strings.Contains(err.Error(), "API port 7001 is in use") || !strings.Contains(err.Error(), "fix:") {
		t.Errorf("pinned slot with taken port: %v", err)
	}
}

// Two creates at once get different slots (the claim is locked and
// recorded until kind publishes the port); before, both computed slot 1
// and the second failed in kind.
func TestConcurrentCreatesGetDistinctSlots(t *testing.T) {
	e := newEnv(t)
	var wg sync.WaitGroup
	infos := make([]*cluster.Info, 6)
	errs := make([]error, 6)
	for i := range infos {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			infos[i], errs[i] = e.M.Create(context.Background(), cluster.CreateOptions{Name: string(rune('a' + i))})
		}(i)
	}
	wg.Wait()
	seen := map[int]bool{}
	for i := range infos {
		if errs[i] != nil {
			t.Errorf("create %d: %v", i, errs[i])
			continue
		}
		if seen[infos[i].Slot] {
			t.Errorf("slot %d given twice", infos[i].Slot)
		}
		seen[infos[i].Slot] = true
	}
}

type stubRunner func(argv []string) (vm.Result, error)

func (s stubRunner) Run(ctx context.Context, argv []string, opts vm.RunOptions) (vm.Result, error) {
	return s(argv)
}

func TestGuestPortCheck(t *testing.T) {
	var got []string
	check := cluster.GuestPortCheck(stubRunner(func(argv []string) (vm.Result, error) {
		got = argv
		if argv[2] == "sport = :7001" {
			return vm.Result{Stdout: []byte("LISTEN 0 4096 0.0.0.0:7001 0.0.0.0:*\n")}, nil
		}
		return vm.Result{}, nil
	}))
	if err := check(context.Background(), 7001); err == nil || !strings.Contains(err.Error(), "0.0.0.0:7001") {
		t.Errorf("busy: %v", err)
	}
	if err := check(context.Background(), 7002); err != nil || strings.Join(got, " ") != "ss -Hltn sport = :7002" {
		t.Errorf("free: %v %q", err, got)
	}
}

// The guest check with the real ss (run here through the host driver's
// runner, as it runs in the VM) against a real listener.
func TestGuestPortCheckRealSS(t *testing.T) {
	if _, err := exec.LookPath("ss"); err != nil {
		t.Skip("no ss here")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	check := cluster.GuestPortCheck(vm.NewHost())
	if err := check(context.Background(), port); err == nil || !strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(port)) {
		t.Errorf("listening port: %v", err)
	}
	l.Close()
	if err := check(context.Background(), port); err != nil {
		t.Errorf("closed port: %v", err)
	}
}
