// Command k3sm is a whole Kubernetes distribution in one binary. It only
// wires: the hidden roles the supervisor re-executes it with, and the CLI.
package main

import (
	"os"

	// Keeps kubectl's translations out of every process but kubectl.
	_ "github.com/k3sm-dev/k3sm/internal/upstream/kubectli18n"

	"github.com/k3sm-dev/k3sm/internal/agent/node"
	"github.com/k3sm-dev/k3sm/internal/k3smcmd"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/join"
	"github.com/k3sm-dev/k3sm/internal/server/localnode"
	"github.com/k3sm-dev/k3sm/internal/upstream"
)

func main() {
	roles := upstream.Roles()
	roles[roleconfig.Node] = node.Main
	if len(os.Args) > 1 {
		if run, ok := roles[os.Args[1]]; ok {
			os.Exit(run(os.Args[2:]))
		}
	}
	os.Exit(k3smcmd.Execute(k3smcmd.Upstream{Kubectl: upstream.Kubectl, Flags: upstream.Flags}, func(cfg *controlplane.Config) []controlplane.Addon {
		if cfg.DisableAgent {
			return []controlplane.Addon{join.Addon(nil)}
		}
		return []controlplane.Addon{localnode.Addon(nil), join.Addon(nil)}
	}))
}
