package main

import (
	"os"
	"os/exec"
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	ms := time.Millisecond
	if got := median([]time.Duration{3 * ms, 1 * ms, 2 * ms}); got != 2*ms {
		t.Errorf("odd: %v", got)
	}
	if got := median([]time.Duration{4 * ms, 1 * ms, 2 * ms, 3 * ms}); got != 2500*time.Microsecond {
		t.Errorf("even: %v", got)
	}
	if got := median(nil); got != -1 {
		t.Errorf("empty: %v", got)
	}
}

func TestFloorArgsForDir(t *testing.T) {
	fa := floorArgs{templateDir: "/w/template/data", apiPort: 1234}
	got := fa.forDir([]string{"kube-apiserver", "--secure-port=1234", "--tls-cert-file=/w/template/data/server/tls/a.crt", "--etcd-servers=unix://kine.sock"}, "/w/r1/floor", 999)
	want := []string{"kube-apiserver", "--secure-port=999", "--tls-cert-file=/w/r1/floor/server/tls/a.crt", "--etcd-servers=unix://kine.sock"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestTreeFindsChildren(t *testing.T) {
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	pids := tree(os.Getpid())
	if len(pids) < 2 || pids[0] != os.Getpid() || !slices.Contains(pids, child.Process.Pid) {
		t.Fatalf("tree(self) = %v, want self first and child %d", pids, child.Process.Pid)
	}
	m, err := smapsRollup(os.Getpid())
	if err != nil {
		t.Skipf("no smaps_rollup here: %v", err)
	}
	if m.RSS <= 0 || m.PSS <= 0 || m.PSS > m.RSS {
		t.Fatalf("implausible memory of self: %+v", m)
	}
}
