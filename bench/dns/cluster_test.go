//go:build linux

package main

import (
	"os"
	"slices"
	"testing"
)

func TestClusterArgs(t *testing.T) {
	defer func(a []string) { os.Args = a }(os.Args)
	os.Args = []string{"dns", "-cluster", "-rounds", "3", "-k3sm-bin", "/abs/k3sm", "-coredns", "/abs/coredns"}
	if got := clusterArgs(); !slices.Equal(got, []string{"-cluster", "-rounds", "3"}) {
		t.Errorf("clusterArgs() = %q", got)
	}
	os.Args = []string{"dns", "-cluster"}
	if got := clusterArgs(); !slices.Equal(got, []string{"-cluster"}) {
		t.Errorf("clusterArgs() = %q", got)
	}
}

func TestProcFigures(t *testing.T) {
	if rss, pss := rollup(os.Getpid()); rss <= 0 || pss <= 0 || pss > rss {
		t.Errorf("rollup: RSS %d kB, PSS %d kB", rss, pss)
	}
	for i := 0; treeCPU(os.Getpid()) == 0 && i < 1e9; i++ {
	}
	if treeCPU(os.Getpid()) <= 0 {
		t.Error("treeCPU of this process is 0 after spinning")
	}
}
