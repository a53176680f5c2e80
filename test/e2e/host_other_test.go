//go:build !linux

package e2e

import (
	"errors"
	"net/netip"
)

// Network namespaces, the mounts netd makes and the node's nftables exist
// only on Linux (host_linux_test.go); the tests that use them need a pod
// network (requirePodNetwork) or root, and skip first.

var errLinuxOnly = errors.New("network namespaces and nftables exist only on Linux")

func inNetNS(nsPath string, f func() error) error { return errLinuxOnly }

func unmountDetach(path string) {}

func servicesMapHas(name string, ip netip.Addr) error { return errLinuxOnly }

func servicesChainExists(chain string) error { return errLinuxOnly }
