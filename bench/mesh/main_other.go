//go:build !linux

// Command mesh measures the Linux WireGuard mesh; elsewhere it says so.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "bench/mesh: the mesh data path it measures (network namespaces, TUN links) is Linux only")
}
