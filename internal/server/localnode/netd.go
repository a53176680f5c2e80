package localnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
)

// NetdBinary is k3sm-netd's file name, next to the k3sm executable: a small
// binary of its own, since it is the one process that runs as root.
const NetdBinary = "k3sm-netd"

// netdPath finds k3sm-netd beside exe.
func netdPath(exe string) (string, error) {
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

// runtimedPath finds k3sm-runtimed beside exe.
func runtimedPath(exe string) (string, error) {
	p, err := supervisor.Beside(exe, RuntimedBinary)
	if err != nil {
		return "", fmt.Errorf("runtime: %w", err)
	}
	return p, nil
}

// startNetd writes netd's role config and starts it; it returns once netd
// accepts calls, so the runtime's first pod finds it.
func startNetd(ctx context.Context, p *controlplane.Plane, sup *supervisor.Supervisor) error {
	bin, err := netdPath(p.Cfg.Executable)
	if err != nil {
		return err
	}
	ranges := map[string]netip.Prefix{}
	for flag, s := range map[string]string{"cluster-cidr": p.Cfg.ClusterCIDR, "service-cidr": p.Cfg.ServiceCIDR} {
		if r, err := netip.ParsePrefix(s); err == nil {
			ranges[flag] = r
		}
	}
	if err := routeCollision(ranges, "k3sm0"); err != nil {
		return err
	}
	l := p.Layout
	args, err := roleconfig.Write(l.RoleConfig(roleconfig.Netd), roleconfig.NetdConfig{
		Socket: l.NetdSocket(), StateFile: l.NetdStateFile(), NetNSDir: l.NetNSDir(),
		// Its clients, the runtime daemon and the node's Service proxy,
		// run as this user.
		AllowedUID: os.Geteuid(),
	})
	if err != nil {
		return err
	}
	c, err := sup.Start(ctx, netdComponent{bin: bin, p: p, args: args})
	if err != nil {
		return err
	}
	return c.WaitReady(ctx)
}

type netdComponent struct {
	bin  string
	p    *controlplane.Plane
	args []string
}

func (n netdComponent) Name() string { return roleconfig.Netd }
func (n netdComponent) Command() supervisor.Command {
	return supervisor.Command{Path: n.bin, Dir: n.p.Cfg.DataDir, Args: n.args}
}
func (n netdComponent) Ready(ctx context.Context) error {
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", n.p.Layout.NetdSocket())
	if err != nil {
		return err
	}
	return c.Close()
}

// podNetworkMode resolves --pod-network: "netns" needs root (k3sm-netd);
// "auto" is netns as root on Linux, else host.
func podNetworkMode(mode, goos string, euid int, external string) (netns bool, reason string, err error) {
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
