//go:build !linux

// Command failover measures server failover on Linux; elsewhere it says so.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "bench/failover: it runs servers in Linux network namespaces; Linux only")
	os.Exit(2)
}
