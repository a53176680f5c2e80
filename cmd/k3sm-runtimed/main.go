// Command k3sm-runtimed is the runtime daemon (internal/runtime/daemon),
// started by `k3sm server` with --config=<role config>. It is a binary of
// its own, next to k3sm, so that its long-running process does not pay the
// package initialisation and pages of the control plane (checked by
// internal/architecture).
package main

import (
	"os"

	"github.com/k3sm-dev/k3sm/internal/runtime/daemon"
)

func main() { os.Exit(daemon.Main(os.Args[1:])) }
