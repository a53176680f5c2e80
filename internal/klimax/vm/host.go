package vm

import (
	"context"
	"net/netip"
	"os"
)

// Host is the driver for Linux: no VM; Docker, kind and the clusters run on
// the local host with its own Docker engine, and the kind bridge is directly
// reachable, so no route is needed. It never starts, stops or removes
// anything of the host itself.
type Host struct{}

// NewHost returns the host driver.
func NewHost() *Host { return &Host{} }

func (*Host) Name() string                         { return "host" }
func (*Host) Ensure(context.Context) (bool, error) { return false, nil }
func (*Host) Start(context.Context) error          { return nil }
func (*Host) Stop(context.Context) error           { return nil }
func (*Host) Delete(context.Context) error         { return nil }
func (*Host) NeedsRoute() bool                     { return false }
func (*Host) DockerHost() string                   { return "" }

func (*Host) Status(context.Context) (State, error) {
	name, _ := os.Hostname()
	return State{Name: name, Driver: "host", Phase: PhaseRunning, Detail: "local host (no VM)"}, nil
}

// Run runs argv on the host; Root uses `sudo -n` unless already root.
func (*Host) Run(ctx context.Context, argv []string, opts RunOptions) (Result, error) {
	if opts.Root && os.Geteuid() != 0 {
		argv = append([]string{"sudo", "-n", "--"}, argv...)
	}
	return execCommand(ctx, argv, nil, opts)
}

// Shell runs args, or the user's $SHELL, attached to the terminal.
func (*Host) Shell(ctx context.Context, args []string, tio IO) error {
	if len(args) == 0 {
		sh := os.Getenv("SHELL")
		if sh == "" {
			sh = "/bin/sh"
		}
		args = []string{sh}
	}
	return interactive(ctx, args, tio)
}

// HostAddress is the loopback address: kind publishes API ports there.
func (*Host) HostAddress(context.Context) (netip.Addr, error) {
	return netip.MustParseAddr("127.0.0.1"), nil
}
