// Package nodeproc owns the processes of a node as both the server's own
// node and `k3sm agent` run them: k3sm-netd (root, the pod network),
// k3sm-runtimed and the node role, each a supervisor component with its
// binary beside k3sm, its role config and its readiness; and the choice of
// pod network (--pod-network) with the checks it needs on the machine.
package nodeproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
)

// NetdBinary is k3sm-netd's file name, next to the k3sm executable: a small
// binary of its own, since it is the one process that runs as root.
const NetdBinary = "k3sm-netd"

// NetdPath finds k3sm-netd beside exe.
func NetdPath(exe string) (string, error) {
	p, err := supervisor.Beside(exe, NetdBinary)
	if err != nil {
		return "", fmt.Errorf("pod network: %w, or run with --pod-network=host", err)
	}
	return p, nil
}

// RuntimedBinary is the runtime daemon's file name, next to the k3sm
// executable: a small binary of its own, so that its long-lived process does
// not carry the control plane's packages.
const RuntimedBinary = "k3sm-runtimed"

// RuntimedPath finds k3sm-runtimed beside exe.
func RuntimedPath(exe string) (string, error) {
	p, err := supervisor.Beside(exe, RuntimedBinary)
	if err != nil {
		return "", fmt.Errorf("runtime: %w", err)
	}
	return p, nil
}

// StartNetd checks the cluster's ranges against the machine's routes,
// writes netd's role config and starts it; it returns once netd accepts
// calls, so the runtime's first pod finds it.
func StartNetd(ctx context.Context, sup *supervisor.Supervisor, exe, dataDir, clusterCIDR, serviceCIDR string) error {
	bin, err := NetdPath(exe)
	if err != nil {
		return err
	}
	ranges := map[string]netip.Prefix{}
	for flag, s := range map[string]string{"cluster-cidr": clusterCIDR, "service-cidr": serviceCIDR} {
		if r, err := netip.ParsePrefix(s); err == nil {
			ranges[flag] = r
		}
	}
	if err := RouteCollision(ranges, "k3sm0"); err != nil {
		return err
	}
	l := datadir.New(dataDir)
	args, err := roleconfig.Write(l.RoleConfig(roleconfig.Netd), roleconfig.NetdConfig{
		Socket: l.NetdSocket(), StateFile: l.NetdStateFile(), NetNSDir: l.NetNSDir(),
		// Its clients, the runtime daemon and the node's Service proxy,
		// run as this user.
		AllowedUID: os.Geteuid(),
	})
	if err != nil {
		return err
	}
	c, err := sup.Start(ctx, component{name: roleconfig.Netd, cmd: supervisor.Command{Path: bin, Dir: dataDir, Args: args}, socket: l.NetdSocket()})
	if err != nil {
		return err
	}
	return c.WaitReady(ctx)
}

// Runtime is the runtime daemon's component: ready once its socket accepts.
func Runtime(bin, dataDir string, args []string) supervisor.Component {
	return component{name: roleconfig.Runtime, cmd: supervisor.Command{Path: bin, Dir: dataDir, Args: args, Settle: true},
		socket: datadir.New(dataDir).RuntimeSocket()}
}

// Node is the node role's component (exe node --config=...); ready says
// when its Node is Ready, read with whatever credential the caller holds.
func Node(exe, dataDir string, args []string, ready func(context.Context) error) supervisor.Component {
	return component{name: roleconfig.Node, cmd: supervisor.Command{Path: exe, Dir: dataDir, Args: append([]string{roleconfig.Node}, args...), Settle: true},
		ready: ready}
}

type component struct {
	name   string
	cmd    supervisor.Command
	socket string
	ready  func(context.Context) error
}

func (c component) Name() string                { return c.name }
func (c component) Command() supervisor.Command { return c.cmd }
func (c component) Ready(ctx context.Context) error {
	if c.ready != nil {
		return c.ready(ctx)
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", c.socket)
	if err != nil {
		return err
	}
	return conn.Close()
}

// PodNetworkMode resolves --pod-network: "netns" needs root (k3sm-netd);
// "auto" is netns as root on Linux, else host.
func PodNetworkMode(mode, goos string, euid int, external string) (netns bool, reason string, err error) {
	if external != "" {
		// A k3sm-netd run apart (as root) serves this server's uid.
		if goos != "linux" {
			return false, "", errors.New("--netd-socket: pod network namespaces exist only on Linux")
		}
		return true, "", nil
	}
	switch mode {
	case "", "auto":
		if goos != "linux" {
			return false, "pods share the node's network on " + goos, nil
		}
		if euid != 0 {
			return false, "k3sm is not running as root, so k3sm-netd cannot make pod networks: pods share the node's network (run as root for a network per pod)", nil
		}
		return true, "", nil
	case "netns":
		if goos != "linux" {
			return false, "", errors.New("--pod-network=netns: network namespaces exist only on Linux; use --pod-network=host")
		}
		if euid != 0 {
			return false, "", errors.New("--pod-network=netns: k3sm-netd needs root to make pod networks; run k3sm as root, or use --pod-network=host")
		}
		return true, "", nil
	case "host":
		return false, "--pod-network=host: pods share the node's network", nil
	}
	return false, "", fmt.Errorf("--pod-network=%q: use auto, netns or host", mode)
}
