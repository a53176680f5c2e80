//go:build !linux

// Command podnet measures the Linux pod network; elsewhere it says so.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "bench/podnet: the pod network data path it measures is Linux only")
}
