//go:build !linux

// Command join measures `k3sm agent` joins on Linux; elsewhere it says so.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "bench/join: it runs agents in Linux network namespaces; Linux only")
	os.Exit(1)
}
