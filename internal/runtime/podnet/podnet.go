// Package podnet is how the runtime enters a pod's network: starting a
// container's shim inside the pod's network namespace, and dialing inside
// it for probes and port-forward, so a pod's ports are reached in its own
// network and never on the host's. The namespace itself (and the address
// in it) is k3sm-netd's; this package only joins what netd made.
package podnet

import (
	"context"
	"net"
)

// Dial connects to addr from inside the network namespace bound at nsPath
// ("" = the caller's own network).
func Dial(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	if nsPath == "" {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	return dialIn(ctx, nsPath, network, addr)
}

// StartIn runs start (a fork and exec: exec.Cmd.Start) so that the child
// begins in the network namespace bound at nsPath ("" = the caller's).
func StartIn(nsPath string, start func() error) error {
	if nsPath == "" {
		return start()
	}
	return startIn(nsPath, start)
}

// Pinned reports whether nsPath is a network namespace pinned where this
// process sees it. On Linux a pin is a bind mount, so a file whose mount
// went with another mount namespace (netd restarted under `ip netns exec`
// or PrivateMounts=) is no pin, though the file is still there.
func Pinned(nsPath string) bool { return pinned(nsPath) }

// InNetNS reports whether process pid runs in the network namespace
// pinned at nsPath; known is false when either cannot be read (no such
// process, no pin, or elsewhere than Linux).
func InNetNS(pid int, nsPath string) (in, known bool) { return inNetNS(pid, nsPath) }
