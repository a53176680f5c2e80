// Command k3sm-netd is k3sm's only privileged process: it gives each pod an
// address on the node's pod network (see internal/netd/server) and serves
// only k3sm's own uid. It stays small, linking the standard library, x/sys,
// the data path's netlink and nftables libraries, wireguard-go for the
// mesh and a few small k3sm packages (checked by internal/architecture).
package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/server"
	"github.com/k3sm-dev/k3sm/internal/roleconfig/netdconfig"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	// A handful of requests a minute: no need for a thread per core.
	runtime.GOMAXPROCS(2)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// `k3sm-netd remove --config=FILE` (k3sm uninstall) takes the pod
	// network off the machine instead of serving.
	remove := len(args) > 0 && args[0] == "remove"
	if remove {
		args = args[1:]
	}
	cfg, err := netdconfig.Read(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	newDataplane := func() (dataplane.Dataplane, error) {
		return dataplane.New(dataplane.Options{NetNSDir: cfg.NetNSDir, Logger: log})
	}
	if remove {
		n, err := server.RemoveNetwork(server.Config{StateFile: cfg.StateFile, NetNSDir: cfg.NetNSDir, NewDataplane: newDataplane})
		if err != nil {
			fmt.Fprintln(os.Stderr, "k3sm-netd remove:", err)
			return 1
		}
		fmt.Printf("removed the pod network (bridge %s, its routes and nft tables, %d pods' links and namespaces)\n", server.BridgeName, n)
		return 0
	}
	srv, err := server.Start(server.Config{
		Socket: cfg.Socket, StateFile: cfg.StateFile, NetNSDir: cfg.NetNSDir, KeyDir: cfg.KeyDir, AllowedUID: cfg.AllowedUID,
		NewDataplane: newDataplane,
		Logger:       log,
	})
	if err != nil {
		log.Error("k3sm-netd cannot start", "err", err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	watchParent(func() { sig <- syscall.SIGTERM })
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Wait() }()
	select {
	case s := <-sig:
		// Pods keep their network: only the socket goes.
		log.Info("k3sm-netd stopping", "signal", s.String())
		srv.Close()
		return 0
	case err := <-stopped:
		log.Error("k3sm-netd stopped", "err", err)
		return 1
	}
}

// parentFDEnv is internal/supervisor's ParentFDEnv (pinned by a test; not
// imported, to keep the supervisor's log rotation out of the root binary):
// the supervisor's end of a pipe on fd 3 that closes when it dies. netd then
// stops as every supervised child does, so a new server never finds an
// orphaned netd on its socket.
const parentFDEnv = "K3SM_PARENT_FD"

func watchParent(onGone func()) {
	if os.Getenv(parentFDEnv) != "3" {
		return
	}
	os.Unsetenv(parentFDEnv)
	syscall.CloseOnExec(3)
	f := os.NewFile(3, "parent-pipe")
	go func() {
		var b [1]byte
		for {
			if _, err := f.Read(b[:]); err != nil {
				onGone()
				return
			}
		}
	}()
}
