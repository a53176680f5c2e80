//go:build !linux

package podnet

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime"
)

// Elsewhere a pod's network is not a namespace (darwin: an lo0 alias the
// pod binds), so there is nothing to enter.
var errNoNetNS = errors.New("pod network namespaces exist only on Linux (this is " + runtime.GOOS + ")")

func dialIn(context.Context, string, string, string) (net.Conn, error) { return nil, errNoNetNS }
func startIn(string, func() error) error                               { return errNoNetNS }

func pinned(nsPath string) bool {
	_, err := os.Lstat(nsPath)
	return err == nil
}

func inNetNS(int, string) (bool, bool) { return false, false }
