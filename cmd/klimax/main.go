// Command klimax manages local fleets of kind clusters in one Lima VM (macOS)
// or on the local Docker engine (Linux). All logic lives in internal/klimax.
package main

import (
	"os"

	"github.com/k3sm-dev/k3sm/internal/klimax/cli"
)

func main() { os.Exit(cli.Execute()) }
