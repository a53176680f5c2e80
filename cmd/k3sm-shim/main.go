// Command k3sm-shim is the resident per-container shim started by the k3sm
// runtime daemon; see package internal/runtime/shim. It must stay small: it
// imports nothing from Kubernetes or gRPC (checked by a test).
package main

import (
	"os"

	"github.com/k3sm-dev/k3sm/internal/runtime/shim"
)

func main() { os.Exit(shim.Main(os.Args)) }
