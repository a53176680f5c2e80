//go:build !linux

package main

import (
	"fmt"
	"os"
)

// cluster: the -cluster mode runs `k3sm server` in a network namespace of
// its own, which only Linux has.
func cluster(options) int {
	fmt.Fprintln(os.Stderr, "bench/dns -cluster: Linux only (it runs the cluster in a network namespace of its own)")
	return 2
}
