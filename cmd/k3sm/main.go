// Command k3sm is a whole Kubernetes distribution in one binary.
package main

import (
	"os"

	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/k3smcmd"
	"github.com/k3sm-dev/k3sm/internal/agent/metrics"
	"github.com/k3sm-dev/k3sm/internal/agent/node"
	"github.com/k3sm-dev/k3sm/internal/upstream"
)

func main() {
	if len(os.Args) > 1 {
		if run, ok := upstream.Lookup(os.Args[1]); ok {
			os.Exit(run(os.Args[2:]))
		}
	}
	os.Exit(k3smcmd.Execute(upstream.Kubectl, func(*controlplane.Config) []controlplane.Addon {
		m := metrics.NewServerAddon(nil)
		return []controlplane.Addon{node.ServerAddon(m.NodeArgs), m.Addon()}
	}))
}
