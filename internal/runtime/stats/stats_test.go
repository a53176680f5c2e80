package stats

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	line := []byte("1234 (my (odd) prog) S 1 777 777 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 100 1000000 321 18446744073709551615")
	g, ticks, rss, ok := parseStat(line)
	if !ok || g != 777 || ticks != 300 || rss != 321 {
		t.Fatalf("got pgrp %d ticks %d rss %d ok %v", g, ticks, rss, ok)
	}
}

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
	time.Sleep(500 * time.Millisecond)
	m, err := ProcessGroups([]int{cmd.Process.Pid})
	if err != nil {
		t.Fatal(err)
	}
	s := m[cmd.Process.Pid]
	if s.Processes != 1 || s.CPUNanos < 100e6 || s.RSSBytes == 0 {
		t.Fatalf("sample %+v: want one process with >=100ms CPU and some RSS", s)
	}
}
